package kvevents

import (
	"bytes"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// encodeBatch returns the msgpack payload of one batch: the array
// [ts, events, dp_rank] of vLLM's EventBatch, each event a map tagged
// "type" (FormatMap) or an array with the tag first (FormatArray), the
// fields in the order of vLLM's classes. events must be valid.
func encodeBatch(ts time.Time, events []Event, cfg *Config) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(&buf)
	w := &writer{enc: enc, array: cfg.Format == FormatArray}
	w.do(enc.EncodeArrayLen(3))
	w.do(enc.EncodeFloat64(float64(ts.UnixNano()) / 1e9))
	w.do(enc.EncodeArrayLen(len(events)))
	for i := range events {
		w.event(&events[i], cfg.Medium)
	}
	w.do(enc.EncodeInt(int64(cfg.DataParallelRank)))
	if w.err != nil {
		return nil, fmt.Errorf("kvevents: encode batch: %w", w.err)
	}
	return buf.Bytes(), nil
}

// writer writes the fields of one event as map entries or array items.
type writer struct {
	enc   *msgpack.Encoder
	array bool
	err   error // the first error of the encoder
}

func (w *writer) do(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *writer) start(tag string, fields int) {
	if w.array {
		w.do(w.enc.EncodeArrayLen(1 + fields))
		w.do(w.enc.EncodeString(tag))
		return
	}
	w.do(w.enc.EncodeMapLen(1 + fields))
	w.do(w.enc.EncodeString("type"))
	w.do(w.enc.EncodeString(tag))
}

func (w *writer) key(name string) {
	if !w.array {
		w.do(w.enc.EncodeString(name))
	}
}

func (w *writer) event(e *Event, medium string) {
	if e.Medium != "" {
		medium = e.Medium
	}
	enc := w.enc
	switch e.Kind {
	case AllBlocksCleared:
		w.start("AllBlocksCleared", 0)
	case BlockRemoved:
		w.start("BlockRemoved", 3)
		w.key("block_hashes")
		w.hashes(e)
		w.key("medium")
		w.do(enc.EncodeString(medium))
		w.key("group_idx")
		w.do(enc.EncodeInt(int64(e.Group)))
	case BlockStored:
		n := 10
		if e.SlidingWindow > 0 {
			n++ // msgspec leaves out a field at its default (None)
		}
		w.start("BlockStored", n)
		w.key("block_hashes")
		w.hashes(e)
		w.key("parent_block_hash")
		if e.Parent.IsZero() {
			w.do(enc.EncodeNil())
		} else {
			w.do(enc.EncodeUint(e.Parent.Uint64()))
		}
		w.key("token_ids")
		w.do(enc.EncodeArrayLen(len(e.Tokens)))
		for _, t := range e.Tokens {
			w.do(enc.EncodeUint(uint64(t)))
		}
		w.key("block_size")
		w.do(enc.EncodeInt(int64(e.BlockSize)))
		w.key("lora_id") // deprecated in vLLM; always null
		w.do(enc.EncodeNil())
		w.key("medium")
		w.do(enc.EncodeString(medium))
		w.key("lora_name")
		if e.LoraName == "" {
			w.do(enc.EncodeNil())
		} else {
			w.do(enc.EncodeString(e.LoraName))
		}
		w.key("extra_keys")
		w.do(enc.EncodeArrayLen(len(e.Hashes)))
		for i := range e.Hashes {
			var keys []ExtraKey
			if e.ExtraKeys != nil {
				keys = e.ExtraKeys[i]
			}
			if keys == nil {
				w.do(enc.EncodeNil())
				continue
			}
			w.do(enc.EncodeArrayLen(len(keys)))
			for _, k := range keys {
				// vLLM's (identifier, offset) tuple.
				w.do(enc.EncodeArrayLen(2))
				w.do(enc.EncodeString(k.Identifier))
				w.do(enc.EncodeInt(int64(k.Offset)))
			}
		}
		w.key("group_idx")
		w.do(enc.EncodeInt(int64(e.Group)))
		w.key("kv_cache_spec_kind")
		kind := e.SpecKind
		if kind == "" {
			kind = SpecFullAttention
		}
		w.do(enc.EncodeString(kind))
		if e.SlidingWindow > 0 {
			w.key("kv_cache_spec_sliding_window")
			w.do(enc.EncodeInt(int64(e.SlidingWindow)))
		}
	}
}

func (w *writer) hashes(e *Event) {
	w.do(w.enc.EncodeArrayLen(len(e.Hashes)))
	for _, h := range e.Hashes {
		w.do(w.enc.EncodeUint(h.Uint64()))
	}
}
