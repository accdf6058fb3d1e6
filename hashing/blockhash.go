package hashing

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// Token is a token id, as the engine's tokenizer gives it.
type Token = uint32

// BlockHash identifies one full block of tokens together with everything
// before it in its request: the hash of block i covers the hash of block i-1,
// the block's tokens and the request's extra keys (see [Chain]).
//
// The zero BlockHash is never produced by a chain (it would take a BLAKE3
// output of all zeros); [BlockHash.IsZero] tells an unset value.
type BlockHash [32]byte

// String returns h as 64 lowercase hexadecimal digits, the form used in
// store keys and accepted by [ParseBlockHash].
func (h BlockHash) String() string { return hex.EncodeToString(h[:]) }

// IsZero reports whether h is the zero BlockHash (all bytes zero).
func (h BlockHash) IsZero() bool { return h == BlockHash{} }

// Uint64 folds h into the 64-bit integer that vLLM's KV events carry as a
// block hash: its last 8 bytes read big-endian, which is
// int.from_bytes(h, "big") & (2**64 - 1) in Python, as vLLM and llm-d fold
// their own digests (SPEC.md, section 11). Distinct hashes may fold to the
// same integer; the fold names a block on the wire and is never a store key.
func (h BlockHash) Uint64() uint64 { return binary.BigEndian.Uint64(h[len(h)-8:]) }

// MarshalText returns h.String() as bytes.
func (h BlockHash) MarshalText() ([]byte, error) { return hex.AppendEncode(nil, h[:]), nil }

// UnmarshalText parses 64 lowercase hexadecimal digits, as [ParseBlockHash].
func (h *BlockHash) UnmarshalText(b []byte) error {
	v, err := ParseBlockHash(string(b))
	if err != nil {
		return err
	}
	*h = v
	return nil
}

// ParseBlockHash parses exactly 64 lowercase hexadecimal digits, the form
// [BlockHash.String] returns. Errors wrap [ErrMalformedKey].
func ParseBlockHash(s string) (BlockHash, error) {
	var h BlockHash
	if err := parseHex(h[:], s); err != nil {
		return BlockHash{}, fmt.Errorf("%w: block hash %s: %v", ErrMalformedKey, quoteTrunc(s), err)
	}
	return h, nil
}

// parseHex decodes s, which must be exactly 2*len(dst) lowercase hex digits,
// into dst.
func parseHex(dst []byte, s string) error {
	if len(s) != 2*len(dst) {
		return fmt.Errorf("has %d characters, want %d lowercase hex digits", len(s), 2*len(dst))
	}
	for i := range dst {
		hi, ok1 := unhex(s[2*i])
		lo, ok2 := unhex(s[2*i+1])
		if !ok1 || !ok2 {
			j := 2 * i
			if ok1 {
				j++
			}
			return fmt.Errorf("character %q at %d is not a lowercase hex digit", s[j], j)
		}
		dst[i] = hi<<4 | lo
	}
	return nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
