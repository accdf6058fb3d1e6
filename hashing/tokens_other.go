//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package hashing

import "encoding/binary"

const littleEndian = false

// tokenBytes is not used on big-endian machines: tokens are encoded with
// putTokens first.
func tokenBytes(t []Token) []byte { panic("hashing: tokenBytes on a big-endian machine") }

// putTokens writes t as little-endian uint32s at the start of dst.
func putTokens(dst []byte, t []Token) {
	dst = dst[:4*len(t)]
	for i, v := range t {
		binary.LittleEndian.PutUint32(dst[4*i:], v)
	}
}
