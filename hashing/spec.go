package hashing

import "encoding/binary"

// SpecVersion is the version of the byte-level encoding that this package
// implements (hashing/SPEC.md). It is the first byte of every hashed message
// and of [Identity.MarshalBinary], and is part of the derive-key context of
// token digests, so a change of encoding changes every hash and namespace.
const SpecVersion = 2

// MaxBlockSize is the largest block size, in tokens, that a [Chain] and a
// [Layout] accept. The smallest is 1.
const MaxBlockSize = 4096

// Kind tags: the second byte of every hashed message (SPEC.md, "Kinds").
const (
	kindIdentity    = 0x01 // identity encoding, hashed into a namespace
	kindSeed        = 0x02 // chain seed: the request-wide extras
	kindBlock       = 0x03 // block message, tokens inline (block size <= directMax)
	kindBlockSplit  = 0x04 // block message, token digest (block size > directMax)
	kindBlockExtras = 0x05 // per-block extras: multimodal items overlapping a block
)

// Extra kind tags: the first byte of each entry inside a seed or block
// extras message.
const (
	extraCacheSalt  = 0x21
	extraAdapter    = 0x22
	extraOpaque     = 0x23
	extraMultiModal = 0x24
)

// directMax is the largest block size whose tokens go inline in the block
// message. Up to it the message (with a block extras digest) stays within
// one 1 KiB BLAKE3 chunk; above it the tokens are hashed on their own in
// BLAKE3's derive-key mode and the block message carries their digest.
const directMax = 128

// tokenContext is the BLAKE3 derive-key context of token digests.
const tokenContext = "kvconnect hashing v2 block tokens"

// blockHeaderLen is the length of a block message's header: version, kind,
// flags, a zero byte, and the block size as a little-endian uint32.
const blockHeaderLen = 8

// flagExtras is set in a block message's flags byte when the message carries
// a block extras digest.
const flagExtras = 0x01

func blockHeader(kind, flags byte, n int) [blockHeaderLen]byte {
	var h [blockHeaderLen]byte
	h[0] = SpecVersion
	h[1] = kind
	h[2] = flags
	binary.LittleEndian.PutUint32(h[4:], uint32(n))
	return h
}

// appendU32 and friends write the little-endian integers of the encoding.
func appendU32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }
func appendU64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

// appendStr writes a length-prefixed string: its length as a little-endian
// uint32, then its bytes.
func appendStr(b []byte, s string) []byte {
	b = appendU32(b, uint32(len(s)))
	return append(b, s...)
}
