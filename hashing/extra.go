package hashing

import (
	"cmp"
	"encoding/hex"
	"fmt"
	"math"
	"slices"

	"github.com/zeebo/blake3"
)

// MaxExtraLen is the longest string or byte field of an [Extra] (a salt, an
// adapter name, an opaque tag or its data), in bytes. These fields may hold
// any bytes (NUL and bytes that are not UTF-8 included) and are hashed as
// given, never checked or normalised.
const MaxExtraLen = 1 << 20

// Extra is one per-request extra key of a [Chain]: something besides the
// tokens that changes what the KV of a block means. Build it with
// [CacheSalt], [Adapter], [MultiModal] or [Opaque]; the zero Extra is
// invalid. Each kind is encoded with its own tag and length-prefixed fields,
// so no two extras of different kinds, and no two field boundaries, give the
// same bytes.
//
// Request-wide extras (salt, adapter, opaque) are bound into the chain's
// seed, the parent of the first block; every block hash depends on them
// through the chain. Multimodal items are bound into exactly the blocks
// they overlap. An Extra is an immutable value; it is checked by [NewChain].
type Extra struct {
	kind   byte
	s1, s2 string   // salt | adapter name | opaque tag; opaque data
	h      [32]byte // adapter fingerprint | multimodal content hash
	off, n int64    // multimodal item: absolute token offset and length
}

// CacheSalt is a per-request cache salt (like vLLM's cache_salt): requests
// share cached blocks only when their salts are equal. It applies to the
// first block, and through the chain to every block after it. An empty salt
// is rejected by [NewChain]: omit the extra for no salt.
func CacheSalt(salt string) Extra { return Extra{kind: extraCacheSalt, s1: salt} }

// Adapter identifies the LoRA adapter a request runs with: its name and a
// fingerprint of its weights (for example a BLAKE3 or SHA-256 digest of the
// adapter files), so that reloading an adapter under the same name with
// other weights does not reuse its blocks. The package never sees the
// weights: the fingerprint is the engine's, derived the same way by all
// that share a store (SPEC.md, "What the engine supplies"). It applies to every block. The
// name must not be empty and the fingerprint must not be all zeros.
func Adapter(name string, fingerprint [32]byte) Extra {
	return Extra{kind: extraAdapter, s1: name, h: fingerprint}
}

// MultiModal binds a multimodal item (an image, an audio clip) to the blocks
// whose tokens it overlaps: contentHash identifies the item's content,
// offset is the absolute index of its first placeholder token in the
// request and length the number of its placeholder tokens (for vLLM, the
// item's PlaceholderRange offset and length, unchanged). Each block it
// overlaps includes the content hash, the offset relative to the block's
// first token (negative when the item began in an earlier block) and the
// length. Items of one request must not overlap one another.
//
// The content hash is the engine's: a collision-resistant digest of
// whatever decides the item's KV. The package never sees the item; SPEC.md
// ("What the engine supplies") says what to put there, and how to turn a
// string identifier such as vLLM's into one.
func MultiModal(contentHash [32]byte, offset, length int) Extra {
	return Extra{kind: extraMultiModal, h: contentHash, off: int64(offset), n: int64(length)}
}

// Opaque is an engine-defined extra key that applies to every block: tag
// names what data is (for example "prompt_adapter" or "vision_tower"), and
// data is copied. Tags must not be empty and must differ within a chain;
// the order in which opaque extras are given does not matter.
func Opaque(tag string, data []byte) Extra {
	return Extra{kind: extraOpaque, s1: tag, s2: string(data)}
}

// String describes e for logs and error messages.
func (e Extra) String() string {
	switch e.kind {
	case extraCacheSalt:
		return fmt.Sprintf("CacheSalt(%s)", quoteTrunc(e.s1))
	case extraAdapter:
		return fmt.Sprintf("Adapter(%s, %s)", quoteTrunc(e.s1), hex.EncodeToString(e.h[:8]))
	case extraMultiModal:
		return fmt.Sprintf("MultiModal(%s, offset %d, length %d)", hex.EncodeToString(e.h[:8]), e.off, e.n)
	case extraOpaque:
		return fmt.Sprintf("Opaque(%s, %d bytes)", quoteTrunc(e.s1), len(e.s2))
	}
	return "Extra{}"
}

// kindName names an extra kind in error messages.
func kindName(k byte) string {
	switch k {
	case extraCacheSalt:
		return "cache salt"
	case extraAdapter:
		return "adapter"
	case extraMultiModal:
		return "multimodal"
	case extraOpaque:
		return "opaque"
	}
	return "zero"
}

// mmItem is a validated multimodal item. Offsets and lengths are int64 so
// that offset+length (up to 2^31) and block positions are computed alike
// on 32-bit and 64-bit platforms.
type mmItem struct {
	hash   [32]byte
	off, n int64
}

// maxOffset bounds multimodal offsets and lengths: a billion tokens, far
// beyond any context. An item's end, offset+length, is at most 2^31, one
// more than a 32-bit int holds, so positions are computed in int64.
const maxOffset = 1 << 30

// compileExtras validates extras and returns the chain seed and the
// multimodal items sorted by offset. The seed message is described in
// SPEC.md ("Seed").
func compileExtras(extras []Extra) (BlockHash, []mmItem, error) {
	var (
		salt, adapter *Extra
		opaque        []*Extra
		mm            []mmItem
		errs          []error
	)
	for i := range extras {
		e := &extras[i]
		f := func(name string) string { return fmt.Sprintf("extras[%d] (%s).%s", i, kindName(e.kind), name) }
		switch e.kind {
		case extraCacheSalt:
			switch {
			case e.s1 == "":
				errs = append(errs, fieldErr(f("salt"), e.s1, "empty: omit the extra for no salt"))
			case len(e.s1) > MaxExtraLen:
				errs = append(errs, fieldErr(f("salt"), e.s1, "longer than %d bytes", MaxExtraLen))
			case salt != nil:
				errs = append(errs, fieldErr(f("salt"), e.s1, "a second cache salt (the first is %s)", quoteTrunc(salt.s1)))
			default:
				salt = e
			}
		case extraAdapter:
			switch {
			case e.s1 == "":
				errs = append(errs, fieldErr(f("name"), e.s1, "empty: an adapter needs a name"))
			case len(e.s1) > MaxExtraLen:
				errs = append(errs, fieldErr(f("name"), e.s1, "longer than %d bytes", MaxExtraLen))
			case e.h == [32]byte{}:
				errs = append(errs, fieldErr(f("fingerprint"), raw(hex.EncodeToString(e.h[:])), "all zeros: give a digest of the adapter's weights"))
			case adapter != nil:
				errs = append(errs, fieldErr(f("name"), e.s1, "a second adapter (the first is %s)", quoteTrunc(adapter.s1)))
			default:
				adapter = e
			}
		case extraOpaque:
			switch {
			case e.s1 == "":
				errs = append(errs, fieldErr(f("tag"), e.s1, "empty: an opaque extra needs a tag"))
			case len(e.s1) > MaxExtraLen:
				errs = append(errs, fieldErr(f("tag"), e.s1, "longer than %d bytes", MaxExtraLen))
			case len(e.s2) > MaxExtraLen:
				errs = append(errs, fieldErr(f("data"), raw(fmt.Sprintf("%d bytes", len(e.s2))), "longer than %d bytes", MaxExtraLen))
			default:
				opaque = append(opaque, e)
			}
		case extraMultiModal:
			switch {
			case e.h == [32]byte{}:
				errs = append(errs, fieldErr(f("contentHash"), raw(hex.EncodeToString(e.h[:])), "all zeros: give a digest of the item's content"))
			case e.off < 0 || e.off > maxOffset:
				errs = append(errs, fieldErr(f("offset"), e.off, "must be 0 to %d", maxOffset))
			case e.n < 1 || e.n > maxOffset:
				errs = append(errs, fieldErr(f("length"), e.n, "must be 1 to %d", maxOffset))
			default:
				mm = append(mm, mmItem{hash: e.h, off: e.off, n: e.n})
			}
		default:
			errs = append(errs, fieldErr(fmt.Sprintf("extras[%d]", i), raw("Extra{}"), "the zero Extra: build extras with CacheSalt, Adapter, MultiModal or Opaque"))
		}
	}
	slices.SortFunc(opaque, func(a, b *Extra) int { return cmp.Compare(a.s1, b.s1) })
	for i := 1; i < len(opaque); i++ {
		if opaque[i].s1 == opaque[i-1].s1 {
			errs = append(errs, fieldErr("extras (opaque).tag", opaque[i].s1, "given twice: opaque tags must differ"))
		}
	}
	slices.SortFunc(mm, func(a, b mmItem) int {
		return cmp.Or(cmp.Compare(a.off, b.off), cmp.Compare(a.n, b.n))
	})
	for i := 1; i < len(mm); i++ {
		p, c := mm[i-1], mm[i]
		if p.off+p.n > c.off {
			errs = append(errs, fieldErr("extras (multimodal).offset", c.off,
				"the item at offset %d (length %d) overlaps the item at offset %d (length %d)", c.off, c.n, p.off, p.n))
		}
	}
	if len(errs) > 0 {
		return BlockHash{}, nil, joinErrs(errs)
	}

	count := len(opaque)
	if salt != nil {
		count++
	}
	if adapter != nil {
		count++
	}
	if uint64(count) > math.MaxUint32 {
		return BlockHash{}, nil, fieldErr("extras", count, "too many extras")
	}
	msg := make([]byte, 0, 64)
	msg = append(msg, SpecVersion, kindSeed)
	msg = appendU32(msg, uint32(count))
	if salt != nil {
		msg = append(msg, extraCacheSalt)
		msg = appendStr(msg, salt.s1)
	}
	if adapter != nil {
		msg = append(msg, extraAdapter)
		msg = appendStr(msg, adapter.s1)
		msg = append(msg, adapter.h[:]...)
	}
	for _, e := range opaque {
		msg = append(msg, extraOpaque)
		msg = appendStr(msg, e.s1)
		msg = appendStr(msg, e.s2)
	}
	return blake3.Sum256(msg), mm, nil
}
