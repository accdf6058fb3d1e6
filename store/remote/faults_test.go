package remote_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/remote"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// sentinels are the errors of package store.
var sentinels = []error{
	store.ErrNotFound, store.ErrNoSpace, store.ErrLeaseExpired, store.ErrHasLease, store.ErrBufferTooSmall,
	store.ErrInvalidKey, store.ErrInvalidRegion, store.ErrTransfer, store.ErrClosed, store.ErrUnavailable,
}

// TestFaultsCross runs the same calls on two faulty stores with the same
// seed, one called directly and one served: faults are a function of the
// seed and the calls, so every key fails in both or in neither, and each
// error served matches the sentinel of the direct one, with its text.
func TestFaultsCross(t *testing.T) {
	opts := storetest.FaultOptions{Seed: 7, KeyRate: 0.4, CallRate: 0.2, PutErrors: sentinels, GetErrors: sentinels, ExistsErrors: sentinels}
	direct := storetest.NewFaulty(newMemstore(t), opts)
	path := filepath.Join(t.TempDir(), "kv.sock")
	start(t, storetest.NewFaulty(newMemstore(t), opts), remote.ServerOptions{}, path)
	c := dial(t, path, remote.ClientOptions{})

	const n = 64
	mem := host(t, 2*n*512)
	for _, s := range []store.Store{direct, c} {
		if err := s.Register(mem.Region()); err != nil {
			t.Fatal(err)
		}
	}
	keys := make([]string, n)
	src := make([]rdma.Region, n)
	dst := make([]rdma.Region, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("fault/%02d", i)
		src[i] = sub(t, mem.Region(), i*512, 100+i)
		fill(src[i].Bytes(), i)
		dst[i] = sub(t, mem.Region(), (n+i)*512, 512)
	}
	ctx := context.Background()
	calls := []struct {
		name string
		f    func(s store.Store, res []store.Result) error
	}{
		{"Put", func(s store.Store, res []store.Result) error { return s.Put(ctx, keys, src, res) }},
		{"Exists", func(s store.Store, res []store.Result) error { return s.Exists(ctx, keys, res) }},
		{"Get", func(s store.Store, res []store.Result) error { return s.Get(ctx, keys, dst, res) }},
	}
	keyFaults, callFaults := 0, 0
	for round := range 8 {
		for _, call := range calls {
			want, got := make([]store.Result, n), make([]store.Result, n)
			werr, gerr := call.f(direct, want), call.f(c, got)
			name := fmt.Sprintf("round %d: %s", round, call.name)
			if !same(werr, gerr) {
				t.Fatalf("%s = %v served, want %v as called directly", name, gerr, werr)
			}
			if werr != nil {
				callFaults++
				continue
			}
			for i := range keys {
				if want[i].N != got[i].N || !same(want[i].Err, got[i].Err) {
					t.Errorf("%s: key %q = %+v served, want %+v as called directly", name, keys[i], got[i], want[i])
				}
				if want[i].Err != nil {
					keyFaults++
				}
			}
		}
	}
	if keyFaults == 0 || callFaults == 0 {
		t.Errorf("%d per-key and %d whole-call faults compared, want some of each", keyFaults, callFaults)
	}
}

// same reports whether got, an error served, stands for want: both nil,
// or with the same text and matching the same sentinels.
func same(want, got error) bool {
	if want == nil || got == nil {
		return want == got
	}
	if want.Error() != got.Error() {
		return false
	}
	for _, s := range sentinels {
		if errors.Is(want, s) && !errors.Is(got, s) {
			return false
		}
	}
	return true
}
