package hashing

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"slices"
	"strings"

	"github.com/zeebo/blake3"
)

// This file is a second, deliberately plain implementation of SPEC.md,
// written from the document rather than from chain.go: every message is
// built in a fresh buffer, field by field. Tests compare the package
// against it on generated inputs.

// refExtra is an extra as the spec describes it.
type refExtra struct {
	kind      string // "cache_salt", "adapter", "opaque", "multimodal"
	str, data string
	hash      [32]byte
	off, n    int64
}

func (r refExtra) extra() Extra {
	switch r.kind {
	case "cache_salt":
		return CacheSalt(r.str)
	case "adapter":
		return Adapter(r.str, r.hash)
	case "opaque":
		return Opaque(r.str, []byte(r.data))
	case "multimodal":
		return MultiModal(r.hash, int(r.off), int(r.n))
	}
	return Extra{}
}

func refLenStr(b *bytes.Buffer, s string) {
	_ = binary.Write(b, binary.LittleEndian, uint32(len(s)))
	b.WriteString(s)
}

// refSeedMessage is the seed message of SPEC.md "Seed".
func refSeedMessage(extras []refExtra) []byte {
	var salt, adapter []refExtra
	var opaque []refExtra
	for _, e := range extras {
		switch e.kind {
		case "cache_salt":
			salt = append(salt, e)
		case "adapter":
			adapter = append(adapter, e)
		case "opaque":
			opaque = append(opaque, e)
		}
	}
	slices.SortFunc(opaque, func(a, b refExtra) int { return strings.Compare(a.str, b.str) })
	var b bytes.Buffer
	b.Write([]byte{2, 0x02})
	_ = binary.Write(&b, binary.LittleEndian, uint32(len(salt)+len(adapter)+len(opaque)))
	for _, e := range salt {
		b.WriteByte(0x21)
		refLenStr(&b, e.str)
	}
	for _, e := range adapter {
		b.WriteByte(0x22)
		refLenStr(&b, e.str)
		b.Write(e.hash[:])
	}
	for _, e := range opaque {
		b.WriteByte(0x23)
		refLenStr(&b, e.str)
		refLenStr(&b, e.data)
	}
	return b.Bytes()
}

// refBlockExtrasMessage is the block extras message of block [start,
// start+n), or nil when no multimodal item overlaps it.
func refBlockExtrasMessage(extras []refExtra, start, n int64) []byte {
	var items []refExtra
	for _, e := range extras {
		if e.kind == "multimodal" && e.off < start+n && e.off+e.n > start {
			items = append(items, e)
		}
	}
	if len(items) == 0 {
		return nil
	}
	slices.SortFunc(items, func(a, b refExtra) int { return cmp.Compare(a.off, b.off) })
	var b bytes.Buffer
	b.Write([]byte{2, 0x05})
	_ = binary.Write(&b, binary.LittleEndian, uint32(len(items)))
	for _, it := range items {
		b.WriteByte(0x24)
		b.Write(it.hash[:])
		_ = binary.Write(&b, binary.LittleEndian, it.off-start)
		_ = binary.Write(&b, binary.LittleEndian, uint64(it.n))
	}
	return b.Bytes()
}

// refStep is one block of a reference chain, with its intermediate bytes.
type refStep struct {
	extrasMsg   []byte   // block extras message, nil if none
	tokenDigest []byte   // derive-key digest of the tokens (split form), nil otherwise
	msg         []byte   // block message
	hash        [32]byte // BLAKE3 of msg
}

// refChain hashes the full blocks of tokens as SPEC.md "Chain" describes.
func refChain(n int, tokens []Token, extras []refExtra) (seed [32]byte, steps []refStep) {
	seed = blake3.Sum256(refSeedMessage(extras))
	parent := seed
	for i := 0; (i+1)*n <= len(tokens); i++ {
		var tb bytes.Buffer
		for _, t := range tokens[i*n : (i+1)*n] {
			_ = binary.Write(&tb, binary.LittleEndian, t)
		}
		var st refStep
		var kind, flags byte = 0x03, 0
		payload := tb.Bytes()
		if n > 128 {
			kind = 0x04
			st.tokenDigest = make([]byte, 32)
			blake3.DeriveKey("kvconnect hashing v2 block tokens", tb.Bytes(), st.tokenDigest)
			payload = st.tokenDigest
		}
		st.extrasMsg = refBlockExtrasMessage(extras, int64(i)*int64(n), int64(n))
		if st.extrasMsg != nil {
			flags = 1
		}
		var m bytes.Buffer
		m.Write([]byte{2, kind, flags, 0})
		_ = binary.Write(&m, binary.LittleEndian, uint32(n))
		if st.extrasMsg != nil {
			y := blake3.Sum256(st.extrasMsg)
			m.Write(y[:])
		}
		m.Write(parent[:])
		m.Write(payload)
		st.msg = m.Bytes()
		st.hash = blake3.Sum256(st.msg)
		parent = st.hash
		steps = append(steps, st)
	}
	return seed, steps
}

// refIdentityEncoding is the identity encoding of SPEC.md "Identity".
func refIdentityEncoding(id Identity) []byte {
	var b bytes.Buffer
	b.Write([]byte{2, 0x01})
	refLenStr(&b, id.Tenant)
	refLenStr(&b, id.Model)
	refLenStr(&b, id.WeightsVersion)
	_ = binary.Write(&b, binary.LittleEndian, id.Generation)
	refLenStr(&b, id.Format.Device)
	refLenStr(&b, string(id.Format.ModelDType))
	refLenStr(&b, string(id.Format.KVDType))
	refLenStr(&b, id.Format.KVQuant)
	refLenStr(&b, string(id.Format.MLADType))
	l := id.Layout
	for _, v := range []int{l.Layers, l.KVHeads, l.HeadDim, l.BlockSize, l.TPSize, l.Replication} {
		_ = binary.Write(&b, binary.LittleEndian, uint32(v))
	}
	// The groups: none for the default layout, also when it is written
	// out as its one full-attention group of every layer.
	groups := l.Groups
	if len(groups) == 1 {
		g := groups[0]
		all := len(g.Layers) == l.Layers
		for i := 0; all && i < len(g.Layers); i++ {
			all = g.Layers[i] == i
		}
		if all && g.Kind == FullAttention && g.BlockSize == l.BlockSize && g.Window == 0 && g.StateBytes == 0 {
			groups = nil
		}
	}
	_ = binary.Write(&b, binary.LittleEndian, uint32(len(groups)))
	for _, g := range groups {
		b.WriteByte(byte(g.Kind))
		for _, v := range []int{g.BlockSize, g.Window, g.StateBytes, len(g.Layers)} {
			_ = binary.Write(&b, binary.LittleEndian, uint32(v))
		}
		for _, layer := range g.Layers {
			_ = binary.Write(&b, binary.LittleEndian, uint32(layer))
		}
	}
	return b.Bytes()
}
