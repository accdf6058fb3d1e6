package storetest

import (
	"encoding/binary"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
)

// memory is host memory cut into equal slots, where the harness keeps the
// sources and destinations of its calls.
type memory struct {
	mem      *rdma.HostMemory
	slotSize int
	slots    int
}

// newMemory maps slots slots of slotSize bytes, freed when t ends (after
// the stores that registered it are closed: cleanups run last-in first-out).
func newMemory(t testing.TB, slots, slotSize int) *memory {
	t.Helper()
	mem, err := rdma.AllocHost(slots * slotSize)
	if err != nil {
		t.Fatalf("storetest: %v", err)
	}
	t.Cleanup(func() {
		if err := mem.Free(); err != nil {
			t.Errorf("storetest: %v", err)
		}
	})
	return &memory{mem: mem, slotSize: slotSize, slots: slots}
}

func (m *memory) region() rdma.Region { return m.mem.Region() }

// slot returns the first n bytes of slot i as a region.
func (m *memory) slot(i, n int) rdma.Region {
	if i < 0 || i >= m.slots || n < 0 || n > m.slotSize {
		panic("storetest: slot out of range")
	}
	r, err := m.mem.Region().Sub(i*m.slotSize, n)
	if err != nil {
		panic(err)
	}
	return r
}

// subslot returns n bytes of slot i from byte off of it as a region.
func (m *memory) subslot(i, off, n int) rdma.Region {
	if i < 0 || i >= m.slots || off < 0 || n < 0 || off+n > m.slotSize {
		panic("storetest: subslot out of range")
	}
	r, err := m.mem.Region().Sub(i*m.slotSize+off, n)
	if err != nil {
		panic(err)
	}
	return r
}

// bytes returns the whole of slot i.
func (m *memory) bytes(i int) []byte {
	b := m.mem.Bytes()
	return b[i*m.slotSize : (i+1)*m.slotSize]
}

// canary fills b with a pattern that no value generator produces.
func canary(b []byte) {
	for i := range b {
		b[i] = canaryByte(i)
	}
}

func canaryByte(i int) byte { return byte(0xc3 ^ i*7) }

// canaryBroken reports the first byte of b from index from on that no
// longer holds the canary pattern, or -1.
func canaryBroken(b []byte, from int) int {
	for i := from; i < len(b); i++ {
		if b[i] != canaryByte(i) {
			return i
		}
	}
	return -1
}

// fillValue writes the value of key in version v into b: bytes that differ,
// with overwhelming probability, for any other key or version.
func fillValue(b []byte, key string, v uint64) {
	x := hashString(key) ^ (v * 0x9e3779b97f4a7c15)
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x = mix(x + uint64(i))
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	if i < len(b) {
		x = mix(x + uint64(i))
		for j := 0; i+j < len(b); j++ {
			b[i+j] = byte(x >> (8 * j))
		}
	}
}

// value returns a new slice holding the value of key in version v.
func value(key string, v uint64, n int) []byte {
	b := make([]byte, n)
	fillValue(b, key, v)
	return b
}

// hashString is FNV-1a, mixed: stable across processes and platforms.
func hashString(s string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 0x100000001b3
	}
	return mix(h)
}

// mix is the splitmix64 finalizer.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
