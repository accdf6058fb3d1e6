package memstore_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// TestWatch: a feed reports each new key, each eviction and each removal,
// in order, and a duplicate put, a failed remove and Close report nothing.
func TestWatch(t *testing.T) {
	s := open(t, memstore.Config{Capacity: 64 << 10, HighWatermark: 1, EvictRatio: 0.01, Shards: 1})
	defer s.Close()
	f, err := s.Watch(100)
	if err != nil {
		t.Fatal(err)
	}
	mem := hostMemory(t, 64<<10)
	r := mem.Region()
	res := make([]store.Result, 3)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Put(ctx, []string{"a", "b", "a"}, []rdma.Region{sub(t, r, 0, 1000), sub(t, r, 0, 3000), sub(t, r, 0, 5)}, res))
	must(s.Put(ctx, []string{"c"}, []rdma.Region{sub(t, r, 0, 62<<10)}, res[:1])) // evicts b: the duplicate put used a later
	must(s.Remove(ctx, "c"))
	if err := s.Remove(ctx, "c"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Remove(c) again = %v, want store.ErrNotFound", err)
	}
	must(s.Put(ctx, []string{"p1", "p2", "q"}, []rdma.Region{sub(t, r, 0, 10), sub(t, r, 0, 10), sub(t, r, 0, 10)}, res))
	if n, err := s.RemovePrefix(ctx, "p"); err != nil || n != 2 {
		t.Fatalf("RemovePrefix(p) = %d, %v; want 2, nil", n, err)
	}
	if n, err := s.RemoveAll(ctx); err != nil || n != 2 {
		t.Fatalf("RemoveAll() = %d, %v; want 2, nil", n, err)
	}
	got, lost := f.Take(nil)
	ev := func(k string, op store.KeyOp) store.KeyEvent { return store.KeyEvent{Key: k, Op: op} }
	want := []store.KeyEvent{
		ev("a", store.KeyStored), ev("b", store.KeyStored),
		ev("b", store.KeyEvicted), ev("c", store.KeyStored),
		ev("c", store.KeyRemoved),
		ev("p1", store.KeyStored), ev("p2", store.KeyStored), ev("q", store.KeyStored),
		ev("p1", store.KeyRemoved), ev("p2", store.KeyRemoved),
		ev("a", store.KeyRemoved), ev("q", store.KeyRemoved),
	}
	// RemovePrefix and RemoveAll walk a map: their keys come in any order.
	if n := len(want); len(got) == n {
		sortKeys(got[n-4 : n-2])
		sortKeys(got[n-2:])
	}
	if diff := cmp.Diff(want, got); diff != "" || lost != 0 {
		t.Errorf("Take() = lost %d, events (-want +got):\n%s", lost, diff)
	}

	must(s.Put(ctx, []string{"z"}, []rdma.Region{sub(t, r, 0, 10)}, res[:1]))
	must(s.Close())
	got, lost = f.Take(nil)
	if diff := cmp.Diff([]store.KeyEvent{ev("z", store.KeyStored)}, got); diff != "" || lost != 0 {
		t.Errorf("after Close: Take() = lost %d, events (-want +got):\n%s", lost, diff)
	}
	if _, err := s.Watch(10); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Watch after Close = %v, want store.ErrClosed", err)
	}
}

// TestWatchOverflow: a feed that fills drops and counts, and its reader
// learns how many it lost; the store goes on.
func TestWatchOverflow(t *testing.T) {
	s := open(t, memstore.Config{Capacity: 64 << 10})
	defer s.Close()
	f, err := s.Watch(3)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := s.Watch(0); err == nil {
		t.Errorf("Watch(0) = nil error, want one naming the buffer")
	}
	mem := hostMemory(t, 4096)
	keys := make([]string, 10)
	src := make([]rdma.Region, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		src[i] = sub(t, mem.Region(), 0, 64)
	}
	res := make([]store.Result, len(keys))
	if err := s.Put(ctx, keys, src, res); err != nil {
		t.Fatal(err)
	}
	got, lost := f.Take(nil)
	if len(got) != 3 || lost != 7 || f.Dropped() != 7 {
		t.Errorf("Take() = %d events, lost %d, Dropped() = %d; want 3, 7, 7", len(got), lost, f.Dropped())
	}
	if st := s.Stats(); st.Keys != 10 {
		t.Errorf("Stats().Keys = %d, want 10: a full feed must not hold the store up", st.Keys)
	}
}

func sortKeys(evs []store.KeyEvent) {
	slices.SortFunc(evs, func(a, b store.KeyEvent) int { return strings.Compare(a.Key, b.Key) })
}
