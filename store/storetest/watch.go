package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// watch checks a store that implements store.Watcher: Watch refuses a
// buffer outside [1, store.MaxWatch]; every key that Remove, RemovePrefix
// and RemoveAll take is announced gone once, to every open feed, and no
// key that was not there; KeyStored, from a store that announces it, only
// for keys put, before they leave; a full feed drops and counts what does
// not fit (Take's lost, Dropped), holding at most its buffer; a closed
// feed gets nothing more; and Watch after the store's Close fails with
// store.ErrClosed. Events may come after the call that caused them
// returns, in the order of the calls: the checks wait for the event of a
// key removed last (a minute at most).
func (h *harness) watch(t tester) {
	mem := newMemory(t, 10, 64)
	s := h.open(t, mem)
	w, ok := s.(store.Watcher)
	if !ok {
		t.Skip("the store does not implement store.Watcher")
	}
	for _, n := range []int{0, -1, store.MaxWatch + 1} {
		if f, err := w.Watch(n); err == nil {
			f.Close()
			t.Errorf("Watch(%d) = nil error, want one: a feed holds 1 to store.MaxWatch events", n)
		}
	}
	f, err := w.Watch(4096)
	if err != nil {
		t.Fatalf("Watch(4096) = %v, want nil", err)
	}
	defer f.Close()
	small, err := w.Watch(2)
	if err != nil {
		t.Fatalf("Watch(2) = %v, want nil", err)
	}
	defer small.Close()
	closed, err := w.Watch(16)
	if err != nil {
		t.Fatalf("Watch(16) = %v, want nil", err)
	}
	closed.Close()
	closed.Close() // idempotent

	keys := make([]string, 10)
	src := make([]rdma.Region, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("watch@%d", i)
		copy(mem.bytes(i), value(keys[i], 1, 64))
		src[i] = mem.slot(i, 64)
	}
	res := make([]store.Result, len(keys))
	if err := s.Put(background, keys, src, res); err != nil {
		t.Fatalf("Put(%q) = %v, want nil", keys, err)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("Put(%q): key %q: %v, want nil", keys, keys[i], r.Err)
		}
	}
	if err := s.Remove(background, "watch@absent"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Remove(%q) of an absent key = %v, want store.ErrNotFound", "watch@absent", err)
	}
	// Taken by each call: 1 by Remove, 1 by RemovePrefix, the rest by
	// RemoveAll (fewer under leases or eviction).
	var removed []string
	left := func(ks []string) []string {
		var out []string
		for _, k := range ks {
			if !slices.Contains(removed, k) {
				out = append(out, k)
			}
		}
		return out
	}
	switch err := s.Remove(background, keys[0]); {
	case err == nil:
		removed = append(removed, keys[0])
	case errors.Is(err, store.ErrHasLease), h.opts.Evicts && errors.Is(err, store.ErrNotFound):
	default:
		t.Fatalf("Remove(%q) = %v, want nil", keys[0], err)
	}
	// "watch@1" is a prefix of no other key.
	if n, err := s.RemovePrefix(background, keys[1]); err != nil && !errors.Is(err, store.ErrHasLease) {
		t.Fatalf("RemovePrefix(%q) = %d, %v, want 1, nil", keys[1], n, err)
	} else if n == 1 {
		removed = append(removed, keys[1])
	}
	rest := left(keys[2:])
	n, err := s.RemoveAll(background)
	if err != nil && !errors.Is(err, store.ErrHasLease) {
		t.Fatalf("RemoveAll() = %d, %v, want %d, nil", n, err, len(rest))
	}
	if n == len(rest) {
		removed = append(removed, rest...)
	} else {
		// Some were left (leases) or evicted: which, the events must say
		// by themselves; only count them.
		t.Logf("RemoveAll() = %d of %d keys (%v): the keys it took are not known one by one", n, len(rest), err)
	}
	want := len(removed)
	if n != len(rest) {
		want += n
	}
	// A marker, put and removed last: once its event is in, so are the
	// events of every earlier call (a feed holds events oldest first).
	const marker = "watch@marker"
	copy(mem.bytes(0), value(marker, 1, 64))
	if err := s.Put(background, []string{marker}, src[:1], res[:1]); err != nil || res[0].Err != nil {
		t.Fatalf("Put(%q) = %v, %v, want nil", marker, err, res[0].Err)
	}
	if err := s.Remove(background, marker); err != nil {
		t.Fatalf("Remove(%q) = %v, want nil", marker, err)
	}
	want++

	// The big feed: every removed key gone once from each medium (a store
	// in tiers names the tier of each event; a store of one tier names
	// none), nothing else gone.
	var evs []store.KeyEvent
	gone := func() int {
		keys := map[string]bool{}
		for _, e := range evs {
			if e.Op.Gone() {
				keys[e.Key] = true
			}
		}
		return len(keys)
	}
	markerGone := func() bool {
		stored, left := map[string]bool{}, map[string]bool{}
		for _, e := range evs {
			if e.Key == marker {
				switch {
				case e.Op == store.KeyStored:
					stored[e.Medium] = true
				case e.Op.Gone():
					left[e.Medium] = true
				}
			}
		}
		for m := range stored {
			if !left[m] {
				return false
			}
		}
		return len(left) > 0
	}
	deadline := time.Now().Add(waitBound)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		var lost int64
		evs, lost = f.Take(evs)
		if lost > 0 {
			t.Fatalf("a feed of 4096 events lost %d of %d: a feed drops only when full", lost, len(keys))
		}
		if markerGone() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v no event says %q, removed last, is gone; the feed holds %v", waitBound, marker, evs)
		}
		<-tick.C
	}
	seen := map[store.KeyEvent]store.KeyOp{} // by key and medium: the last op
	goneFrom := map[string]bool{}            // keys with a gone event in some medium
	for i, e := range evs {
		at := store.KeyEvent{Key: e.Key, Medium: e.Medium}
		if !strings.HasPrefix(e.Key, "watch@") || e.Key == "watch@absent" {
			t.Errorf("event %d = %+v: a key never put", i, e)
			continue
		}
		switch {
		case e.Op == store.KeyStored:
			if seen[at].Gone() || seen[at] == store.KeyStored {
				t.Errorf("event %d = %+v: stored again, after %v, with no put in between", i, e, seen[at])
			}
		case e.Op.Gone():
			if seen[at].Gone() {
				t.Errorf("event %d = %+v: the key's second gone event (after %v): a key leaves once", i, e, seen[at])
			}
			goneFrom[e.Key] = true
			if e.Op != store.KeyRemoved && !(h.opts.Evicts && e.Op == store.KeyEvicted) {
				t.Errorf("event %d = %+v, want op %v: the key was removed", i, e, store.KeyRemoved)
			}
		default:
			t.Errorf("event %d = %+v: an unknown op", i, e)
		}
		seen[at] = e.Op
	}
	for _, k := range append(removed, marker) {
		if !goneFrom[k] {
			t.Errorf("%q was removed, but no event says it is gone; events: %v", k, evs)
		}
	}
	if got := gone(); got != want {
		t.Errorf("%d keys with events of keys gone, want %d (the keys the removals took); events: %v", got, want, evs)
	}

	// The small feed: at most 2 events per Take, the rest dropped and
	// counted; the closed one: nothing.
	// A store whose feeds are filled apart (a client of a served store
	// fills each over a connection of its own) may still be filling it:
	// take until every event of the big feed is accounted for.
	var small2 []store.KeyEvent
	var lost int64
	for deadline := time.Now().Add(waitBound); ; {
		got, l := small.Take(nil)
		if len(got) > 2 {
			t.Errorf("a feed of 2 events returned %d from Take", len(got))
		}
		small2, lost = append(small2, got...), lost+l
		if int64(len(small2))+lost >= int64(len(evs)) || time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	if int64(len(small2))+lost != int64(len(evs)) {
		t.Errorf("a feed of 2 events returned %d and lost %d, want %d in all: the events of the feed of 4096 (%v)", len(small2), lost, len(evs), evs)
	}
	if d := small.Dropped(); d != lost {
		t.Errorf("Dropped() = %d after Take reported %d lost, want the same", d, lost)
	}
	if again, lost := small.Take(nil); len(again) != 0 || lost != 0 {
		t.Errorf("a second Take = %v, %d lost, want nothing: Take empties the feed", again, lost)
	}
	if got, lost := closed.Take(nil); len(got) != 0 || lost != 0 {
		t.Errorf("a feed closed before any event holds %v, %d lost, want nothing", got, lost)
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v, want nil", err)
	}
	if f, err := w.Watch(16); !errors.Is(err, store.ErrClosed) {
		if f != nil {
			f.Close()
		}
		t.Errorf("Watch(16) after Close = %v, want store.ErrClosed", err)
	}
}
