//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package hashing

import "unsafe"

// littleEndian reports whether tokens are laid out in memory as the
// encoding wants them (little-endian uint32), so they can be hashed in place.
const littleEndian = true

// tokenBytes returns the little-endian bytes of t without copying. Only
// valid where littleEndian is true.
func tokenBytes(t []Token) []byte {
	if len(t) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t))), 4*len(t))
}

// putTokens writes t as little-endian uint32s at the start of dst.
func putTokens(dst []byte, t []Token) { copy(dst, tokenBytes(t)) }
