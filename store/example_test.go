package store_test

import (
	"fmt"

	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// A caller checks for store.Leaser once, when it opens the store, to learn
// whether probing keys with Exists holds them back from removal, and how
// long a Remove may wait. A store that does not implement it may lease.
func ExampleLeaser() {
	s, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()

	var st store.Store = s
	l, ok := st.(store.Leaser)
	if !ok {
		fmt.Println("leases unknown: Remove may fail with store.ErrHasLease")
		return
	}
	switch d := l.Leases(); {
	case !d.Exists && !d.Get:
		fmt.Println("no read leases: removals take every key they name")
	default:
		fmt.Printf("leases on exists %v, on get %v, for %v; Remove waits up to %v\n", d.Exists, d.Get, d.TTL, d.RemoveWait)
	}
	// Output: no read leases: removals take every key they name
}
