package shm

import (
	"encoding/binary"
	"syscall"
	"testing"
)

// FuzzHandle feeds the owner's message handler (a peer's messages are
// outside input) arbitrary bytes: it must never panic, grant only ranges
// inside registered memory, and answer a grant with one entry per range.
func FuzzHandle(f *testing.F) {
	e, err := New(nil)
	if err != nil {
		f.Fatal(err)
	}
	m, err := e.Alloc(1 << 16)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		if err := e.Close(); err != nil {
			f.Error(err)
		}
		if err := m.Free(); err != nil {
			f.Error(err)
		}
	})
	reg, err := m.Region().Sub(4096, 8192)
	if err != nil {
		f.Fatal(err)
	}
	if err := e.Register(reg); err != nil {
		f.Fatal(err)
	}
	grant := func(ranges ...[2]uint64) []byte {
		msg := []byte{opGrant, 0, 0, 0, 0}
		binary.LittleEndian.PutUint32(msg[1:], uint32(len(ranges)))
		for _, r := range ranges {
			msg = binary.LittleEndian.AppendUint64(msg, r[0])
			msg = binary.LittleEndian.AppendUint64(msg, r[1])
		}
		return msg
	}
	a := uint64(reg.Addr)
	f.Add(grant([2]uint64{a, 8192}, [2]uint64{a - 1, 2}, [2]uint64{a + 8191, 2}, [2]uint64{^uint64(0), 2}))
	f.Add(grant())
	f.Add([]byte{opRelease, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{opMap, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{opMap, 9, 9})
	f.Add([]byte{7})
	f.Fuzz(func(t *testing.T, msg []byte) {
		if len(msg) == 0 {
			return // serve never passes an empty message
		}
		grants := make(map[uint64][]uintptr)
		reply, fd, err := e.handle(msg, grants)
		if fd >= 0 {
			if err := syscall.Close(fd); err != nil {
				t.Fatal(err)
			}
		}
		if err != nil {
			if reply != nil {
				t.Fatalf("handle(%x) = a reply and error %v", msg, err)
			}
			return
		}
		if msg[0] == opGrant {
			n := int(binary.LittleEndian.Uint32(msg[1:]))
			if len(reply) != 9+17*n {
				t.Fatalf("grant of %d ranges: reply of %d bytes", n, len(reply))
			}
			for i := range n {
				addr, size := binary.LittleEndian.Uint64(msg[5+16*i:]), binary.LittleEndian.Uint64(msg[13+16*i:])
				if reply[9+17*i] == 1 && (addr < a || size > 8192 || addr-a > 8192-size) {
					t.Fatalf("granted [%#x, +%d), outside the registered [%#x, +8192)", addr, size, a)
				}
			}
		}
		for _, addrs := range grants {
			e.reg.Lock()
			e.ungrant(addrs)
			e.reg.Unlock()
		}
		e.reg.Lock()
		defer e.reg.Unlock()
		if n := e.granted(); n != 0 {
			t.Fatalf("after every grant was released, %d remain", n)
		}
	})
}
