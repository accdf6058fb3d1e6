package store_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/store"
)

func ev(i int) store.KeyEvent {
	return store.KeyEvent{Key: fmt.Sprintf("k%d", i), Op: store.KeyEvicted}
}

func TestFeedOrderAndOverflow(t *testing.T) {
	var fs store.Feeds
	fs.Announce(ev(-1)) // nobody watches: nothing to keep
	f, err := fs.Watch(3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		fs.Announce(ev(i))
	}
	got, lost := f.Take(nil)
	if diff := cmp.Diff([]store.KeyEvent{ev(0), ev(1), ev(2)}, got); diff != "" {
		t.Errorf("Take (-want +got):\n%s", diff)
	}
	if lost != 2 {
		t.Errorf("Take lost = %d, want 2", lost)
	}
	// The ring wraps: the next events come whole, and nothing is lost.
	fs.Announce(ev(5))
	fs.Announce(ev(6))
	got, lost = f.Take(got[:0])
	if diff := cmp.Diff([]store.KeyEvent{ev(5), ev(6)}, got); diff != "" || lost != 0 {
		t.Errorf("second Take = %v, lost %d, want k5 k6, lost 0 (diff %s)", got, lost, diff)
	}
	if f.Dropped() != 2 {
		t.Errorf("Dropped = %d, want 2", f.Dropped())
	}
	f.Close()
	f.Close()
	if fs.Watching() {
		t.Error("Watching after the only feed closed")
	}
	fs.Announce(ev(7))
	if got, _ := f.Take(nil); len(got) != 0 {
		t.Errorf("a closed feed took %v", got)
	}
}

func TestFeedsCloseKeepsHeld(t *testing.T) {
	var fs store.Feeds
	f, _ := fs.Watch(4)
	fs.Announce(ev(1))
	fs.Close()
	fs.Announce(ev(2))
	got, _ := f.Take(nil)
	if diff := cmp.Diff([]store.KeyEvent{ev(1)}, got); diff != "" {
		t.Errorf("Take after Close (-want +got):\n%s", diff)
	}
	if _, err := fs.Watch(4); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Watch after Close = %v, want ErrClosed", err)
	}
}

func TestWatchBounds(t *testing.T) {
	var fs store.Feeds
	for _, n := range []int{0, -1, store.MaxWatch + 1} {
		if _, err := fs.Watch(n); err == nil {
			t.Errorf("Watch(%d) = nil error", n)
		}
	}
}

// Every event announced is either taken or counted lost, under concurrency.
func TestFeedAccountsForEveryEvent(t *testing.T) {
	var fs store.Feeds
	f, _ := fs.Watch(16)
	const writers, each = 4, 2000
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				fs.Announce(ev(w*each + i))
			}
		})
	}
	var taken, lost int64
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var buf []store.KeyEvent
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
		}
		var l int64
		buf, l = f.Take(buf[:0])
		taken += int64(len(buf))
		lost += l
	}
	if taken+lost != writers*each {
		t.Errorf("taken %d + lost %d = %d, want %d", taken, lost, taken+lost, writers*each)
	}
}

func TestKeyOpString(t *testing.T) {
	for op, want := range map[store.KeyOp]string{store.KeyStored: "stored", store.KeyEvicted: "evicted", store.KeyRemoved: "removed", store.KeyExpired: "expired", 9: "KeyOp(9)"} {
		if got := op.String(); got != want {
			t.Errorf("KeyOp(%d).String() = %q, want %q", op, got, want)
		}
	}
	if store.KeyStored.Gone() || !store.KeyExpired.Gone() {
		t.Error("Gone: stored counts as gone, or expired does not")
	}
}

func TestFeedsLost(t *testing.T) {
	var fs store.Feeds
	f, err := fs.Watch(4)
	if err != nil {
		t.Fatal(err)
	}
	fs.Announce(store.KeyEvent{Key: "a", Op: store.KeyStored})
	fs.Lost(3)
	evs, lost := f.Take(nil)
	if len(evs) != 1 || lost != 3 {
		t.Errorf("Take after an event and Lost(3) = %v, %d lost; want 1 event, 3 lost", evs, lost)
	}
	if got := f.Dropped(); got != 3 {
		t.Errorf("Dropped() = %d, want 3", got)
	}
	if _, lost := f.Take(nil); lost != 0 {
		t.Errorf("second Take: %d lost, want 0", lost)
	}
}
