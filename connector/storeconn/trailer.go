package storeconn

import (
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"os"
	"strings"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/zeebo/blake3"
)

// A saved value is the block's bytes followed by a trailer that lets a
// loader check that the bytes it received are the bytes saved under that
// key (verify "checksum", the default):
//
//	offset  size  field
//	0       4     magic "KVt" and the trailer version, 1
//	4       4     block length in bytes, little-endian
//	8       4     CRC-32 (IEEE) of the block's bytes, little-endian
//	12      4     zero
//	16      8     FNV-1a 64 of the key the value was saved under, little-endian
//
// The key digest catches a value that belongs to another key (a store that
// handed out reused memory, a routing bug); the CRC catches a value that was
// torn or changed in flight. CRC-32 with the IEEE polynomial is used rather
// than Castagnoli because Go computes it with carry-less multiplication on
// amd64 (about 33 GB/s against 19 GB/s for Castagnoli on the machines
// measured), and both instructions are as fast on arm64.
const trailerLen = 24

var trailerMagic = [4]byte{'K', 'V', 't', 1}

var crcTable = crc32.MakeTable(crc32.IEEE)

// keyDigest is FNV-1a 64 of key.
func keyDigest(key string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime
	}
	return h
}

// blockCRC is the CRC of a block's bytes, which lie in spans in order.
func blockCRC(spans []rdma.Region) uint32 {
	var c uint32
	for _, sp := range spans {
		c = crc32.Update(c, crcTable, sp.Bytes())
	}
	return c
}

// putTrailer writes into t the trailer of a block of n bytes with CRC crc,
// saved under key.
func putTrailer(t []byte, key string, n int, crc uint32) {
	_ = t[trailerLen-1]
	copy(t[0:4], trailerMagic[:])
	binary.LittleEndian.PutUint32(t[4:8], uint32(n))
	binary.LittleEndian.PutUint32(t[8:12], crc)
	binary.LittleEndian.PutUint32(t[12:16], 0)
	binary.LittleEndian.PutUint64(t[16:24], keyDigest(key))
}

// checkTrailer reports whether t is the trailer of the block of n bytes in
// spans, saved under key; the error says what differs. The cheap checks
// come first, the block's CRC last. It does not allocate unless it fails.
func checkTrailer(t []byte, key string, n int, spans []rdma.Region) error {
	if [4]byte(t[0:4]) != trailerMagic {
		return fmt.Errorf("trailer magic %q, want %q (not a value saved with verification)", t[0:4], trailerMagic[:])
	}
	if m := binary.LittleEndian.Uint32(t[4:8]); m != uint32(n) || binary.LittleEndian.Uint32(t[12:16]) != 0 {
		return fmt.Errorf("trailer for a block of %d bytes, want %d", m, n)
	}
	if d, want := binary.LittleEndian.Uint64(t[16:24]), keyDigest(key); d != want {
		return fmt.Errorf("trailer for another key (key digest %#016x, want %#016x)", d, want)
	}
	if c, want := blockCRC(spans), binary.LittleEndian.Uint32(t[8:12]); c != want {
		return fmt.Errorf("block checksum %#08x, the trailer says %#08x", c, want)
	}
	return nil
}

// With verify "mac" the trailer is keyed with the tenant's secret, so that
// a writer who does not hold it cannot make a value that loads:
//
//	offset  size  field
//	0       4     magic "KVt" and the trailer version, 2
//	4       4     block length in bytes, little-endian
//	8       32    keyed BLAKE3-256 (the secret as key) of: the key's length
//	              as 8 bytes little-endian, the key, the block length as 8
//	              bytes little-endian, then the block's bytes
//
// The MAC binds the block to the key it was saved under: a value copied
// from another key fails as surely as bytes changed in flight.
const macTrailerLen = 40

var macMagic = [4]byte{'K', 'V', 't', 2}

// VerifyKeyEnv is the environment variable a connector with "verify":
// "mac" reads its secret from when kv_connector_extra_config has no
// "verify_key": 64 hex digits, the 32 bytes of the secret.
const VerifyKeyEnv = "KVCONNECT_VERIFY_KEY"

// secret is a MAC key. Printed with any verb it shows "[secret]": no log
// line, error or %v of an options value carries it.
type secret struct{ b *[32]byte }

func (secret) String() string               { return "[secret]" }
func (secret) GoString() string             { return "[secret]" }
func (s secret) Format(f fmt.State, _ rune) { fmt.Fprint(f, "[secret]") }

// parseSecret decodes a secret from 64 hex digits. Its errors never
// carry the text: it is, or is close to, the secret.
func parseSecret(text, from string) (secret, error) {
	text = strings.TrimSpace(text)
	if len(text) != 64 {
		return secret{}, fmt.Errorf("%s holds %d characters, want 64 hex digits (32 bytes)", from, len(text))
	}
	var k [32]byte
	if _, err := hex.Decode(k[:], []byte(text)); err != nil {
		return secret{}, fmt.Errorf("%s is not 64 hex digits (32 bytes)", from)
	}
	return secret{b: &k}, nil
}

// secretFromEnv returns the secret in VerifyKeyEnv.
func secretFromEnv() (secret, bool, error) {
	text, ok := os.LookupEnv(VerifyKeyEnv)
	if !ok {
		return secret{}, false, nil
	}
	s, err := parseSecret(text, "environment variable "+VerifyKeyEnv)
	return s, true, err
}

// keyed returns a BLAKE3 hasher keyed with s.
func (s secret) keyed() *blake3.Hasher {
	h, err := blake3.NewKeyed(s.b[:])
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	return h
}

// macOf writes into sum the MAC of the block of n bytes in spans saved
// under key, with h, a hasher keyed with the tenant's secret (reset
// first).
func macOf(sum *[32]byte, h *blake3.Hasher, key string, n int, spans []rdma.Region) {
	h.Reset()
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(len(key)))
	h.Write(hdr[:])
	h.WriteString(key)
	binary.LittleEndian.PutUint64(hdr[:], uint64(n))
	h.Write(hdr[:])
	for _, sp := range spans {
		h.Write(sp.Bytes())
	}
	h.Sum(sum[:0])
}

// putMAC writes into t the MAC trailer of the block of n bytes in spans,
// saved under key.
func putMAC(t []byte, h *blake3.Hasher, key string, n int, spans []rdma.Region) {
	_ = t[macTrailerLen-1]
	copy(t[0:4], macMagic[:])
	binary.LittleEndian.PutUint32(t[4:8], uint32(n))
	var sum [32]byte
	macOf(&sum, h, key, n, spans)
	copy(t[8:40], sum[:])
}

// checkMAC reports whether t is the MAC trailer of the block of n bytes in
// spans, saved under key, by a holder of h's secret. The error says what
// differs, never what the MAC should be (that would be a forgery for the
// asking).
func checkMAC(t []byte, h *blake3.Hasher, key string, n int, spans []rdma.Region) error {
	if [4]byte(t[0:4]) != macMagic {
		return fmt.Errorf("trailer magic %q, want %q (not a value saved with verify mac)", t[0:4], macMagic[:])
	}
	if m := binary.LittleEndian.Uint32(t[4:8]); m != uint32(n) {
		return fmt.Errorf("trailer for a block of %d bytes, want %d", m, n)
	}
	var sum [32]byte
	macOf(&sum, h, key, n, spans)
	if subtle.ConstantTimeCompare(sum[:], t[8:40]) != 1 {
		return fmt.Errorf("MAC differs: the value was not saved under this key by a holder of the tenant's secret, or it changed since")
	}
	return nil
}
