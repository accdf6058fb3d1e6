package shmfiles_test

import (
	"os"
	"testing"

	"github.com/kvconnect/kvconnect/internal/shmfiles"
	"github.com/kvconnect/kvconnect/rdma/shm"
)

// TestOf: memory an rdma/shm engine of this process allocated is found,
// and no longer once the engine freed it.
func TestOf(t *testing.T) {
	e, err := shm.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := e.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	held, err := shmfiles.Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if len(held) == 0 {
		t.Fatalf("no memory file of this process found while an engine holds one")
	}
	if err := m.Free(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if held, err = shmfiles.Of(os.Getpid()); err != nil || len(held) > 0 {
		t.Fatalf("after Free and Close: %v, %v; want none", held, err)
	}
}
