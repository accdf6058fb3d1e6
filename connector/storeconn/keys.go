package storeconn

import (
	"github.com/kvconnect/kvconnect/hashing"
)

// keyBuf builds batches of store keys with one allocation per batch: the
// keys are appended to one byte buffer, copied once into a string, and
// handed out as substrings of it. A store that keeps a key keeps that
// batch's string alive, no more.
type keyBuf struct {
	b    []byte
	ends []int
}

func (kb *keyBuf) reset() {
	kb.b = kb.b[:0]
	kb.ends = kb.ends[:0]
}

func (kb *keyBuf) add(ns hashing.Namespace, group, shard int, h hashing.BlockHash) {
	kb.b = ns.AppendGroupKey(kb.b, group, shard, h)
	kb.ends = append(kb.ends, len(kb.b))
}

// keys appends the keys added since the last reset to dst.
func (kb *keyBuf) keys(dst []string) []string {
	s := string(kb.b)
	start := 0
	for _, end := range kb.ends {
		dst = append(dst, s[start:end])
		start = end
	}
	return dst
}
