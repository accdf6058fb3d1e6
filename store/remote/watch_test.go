package remote_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/remote"
)

// watched is a memstore that implements store.Watcher: it announces the
// keys that Remove deletes, and those the test announces itself.
type watched struct {
	*memstore.Store
	store.Feeds
}

// Watch is the test's feeds', not the memstore's own: the test announces
// what it expects.
func (w *watched) Watch(n int) (*store.Feed, error) { return w.Feeds.Watch(n) }

func (w *watched) Close() error {
	w.Feeds.Close()
	return w.Store.Close()
}

func (w *watched) Remove(ctx context.Context, key string) error {
	if err := w.Store.Remove(ctx, key); err != nil {
		return err
	}
	w.Announce(store.KeyEvent{Key: key, Op: store.KeyRemoved})
	return nil
}

// watchServed serves a watched memstore with opts and dials it.
func watchServed(t *testing.T, opts remote.ServerOptions) (*watched, *remote.Server, remote.Client) {
	t.Helper()
	w := &watched{Store: newMemstore(t)}
	path := filepath.Join(t.TempDir(), "kv.sock")
	srv := start(t, w, opts, path)
	c := dial(t, path, remote.ClientOptions{})
	return w, srv, c
}

// takeAll takes from f until it has want events and losses in all, and
// returns the events and the count of those lost.
func takeAll(t *testing.T, f *store.Feed, want int) ([]store.KeyEvent, int64) {
	t.Helper()
	var got []store.KeyEvent
	var lost int64
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		var l int64
		got, l = f.Take(got)
		lost += l
		if len(got)+int(lost) >= want {
			return got, lost
		}
		select {
		case <-tick.C:
		case <-timer.C:
			t.Fatalf("the client's feed took %d events and %d lost in %v, want %d in all", len(got), lost, bound, want)
		}
	}
}

func ev(i int, op store.KeyOp) store.KeyEvent {
	return store.KeyEvent{Key: fmt.Sprintf("w/%04d", i), Op: op, Medium: "CPU"}
}

// TestWatch: a client of a store.Watcher is one, and its feed gets the
// served store's events in order, removals by the client's own calls
// included; a client of a store that is no Watcher is none.
func TestWatch(t *testing.T) {
	w, _, c := watchServed(t, remote.ServerOptions{})
	cw, ok := c.(store.Watcher)
	if !ok || !c.Limits().Watcher {
		t.Fatalf("the client of a store.Watcher is a %T, Limits().Watcher %v: want a store.Watcher", c, c.Limits().Watcher)
	}
	f, err := cw.Watch(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []store.KeyEvent
	const n = 2000
	for i := range n {
		e := ev(i, store.KeyOp(1+i%4))
		want = append(want, e)
		w.Announce(e)
	}
	mem := host(t, 4096)
	if err := c.Register(mem.Region()); err != nil {
		t.Fatal(err)
	}
	res := make([]store.Result, 1)
	if err := c.Put(context.Background(), []string{"mine"}, []rdma.Region{mem.Region()}, res); err != nil || res[0].Err != nil {
		t.Fatalf("Put(mine) = %v, %v", err, res[0].Err)
	}
	if err := c.Remove(context.Background(), "mine"); err != nil {
		t.Fatalf("Remove(mine) = %v", err)
	}
	want = append(want, store.KeyEvent{Key: "mine", Op: store.KeyRemoved})
	got, lost := takeAll(t, f, n+1)
	if diff := cmp.Diff(want, got); diff != "" || lost != 0 {
		t.Errorf("the client's feed (-want +got), lost %d, want 0:\n%s", lost, diff)
	}

	path := filepath.Join(t.TempDir(), "plain.sock")
	start(t, struct{ store.Store }{newMemstore(t)}, remote.ServerOptions{}, path)
	if c := dial(t, path, remote.ClientOptions{}); c.Limits().Watcher {
		t.Errorf("the client of a store that is no store.Watcher is a %T, Limits().Watcher true: want no store.Watcher", c)
	} else if _, ok := c.(store.Watcher); ok {
		t.Errorf("the client of a store that is no store.Watcher is a %T, a store.Watcher", c)
	}
}

// TestWatchOverflow announces 100 events into a server's feed of 4 and a
// client's of 4: every event is taken or counted lost, and the events
// taken are in order.
func TestWatchOverflow(t *testing.T) {
	w, _, c := watchServed(t, remote.ServerOptions{MaxWatch: 4})
	f, err := c.(store.Watcher).Watch(4)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const n = 100
	for i := range n {
		w.Announce(ev(i, store.KeyEvicted))
	}
	// Nothing is taken until every event is accounted for: at most 4 are
	// held, so at least 96 are counted dropped, at the server or here.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for f.Dropped() < n-4 {
		select {
		case <-tick.C:
		case <-timer.C:
			t.Fatalf("the client's feed of 4 dropped %d of %d events in %v, want %d at least", f.Dropped(), n, bound, n-4)
		}
	}
	got, lost := takeAll(t, f, n)
	if len(got)+int(lost) != n || lost < n-4 {
		t.Errorf("the client's feed took %d events and %d lost, want %d in all, %d lost at least", len(got), lost, n, n-4)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Key <= got[i-1].Key {
			t.Errorf("the events taken are out of order: %v", got)
			break
		}
	}
}

// TestWatchBroken: the server's end counts lost events in the client's
// feed, and its reader learns of it; a watch of a closed client is
// refused.
func TestWatchBroken(t *testing.T) {
	w, srv, c := watchServed(t, remote.ServerOptions{})
	f, err := c.(store.Watcher).Watch(16)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w.Announce(ev(0, store.KeyStored))
	if got, lost := takeAll(t, f, 1); len(got) != 1 || lost != 0 {
		t.Fatalf("the client's feed took %v, lost %d; want the one event", got, lost)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if got, lost := takeAll(t, f, 1); len(got) != 0 || lost < 1 {
		t.Errorf("after the server closed, the client's feed took %v, lost %d; want a loss", got, lost)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.(store.Watcher).Watch(16); !errors.Is(err, store.ErrClosed) || !strings.Contains(err.Error(), "watch") {
		t.Errorf("Watch after Close = %v, want store.ErrClosed", err)
	}
}

// TestWatchIndex serves a memstore of 64 values with heavy eviction (512
// puts of distinct keys) and keeps an index built only from the client's
// feed: every key put, less those the feed reports gone. Once the feed
// has caught up, the index equals the store's content: 0 stale, 0
// missing. It runs when memstore is a store.Watcher.
func TestWatchIndex(t *testing.T) {
	const size, held, puts = 4096, 64, 512
	inner, err := memstore.New(memstore.Config{Capacity: size * held})
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	if _, ok := any(inner).(store.Watcher); !ok {
		t.Skip("memstore is no store.Watcher")
	}
	path := filepath.Join(t.TempDir(), "kv.sock")
	start(t, inner, remote.ServerOptions{}, path)
	c := dial(t, path, remote.ClientOptions{})
	f, err := c.(store.Watcher).Watch(4 * puts)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem := host(t, size)
	if err := c.Register(mem.Region()); err != nil {
		t.Fatal(err)
	}
	index := make(map[string]bool) // key -> the feed says it is held
	var keys []string
	res := make([]store.Result, 1)
	for i := range puts {
		k := fmt.Sprintf("idx/%04d", i)
		fill(mem.Bytes(), i)
		if err := c.Put(context.Background(), []string{k}, []rdma.Region{mem.Region()}, res); err != nil || res[0].Err != nil {
			t.Fatalf("Put(%s) = %v, %v", k, err, res[0].Err)
		}
		index[k] = true
		keys = append(keys, k)
	}
	var evs []store.KeyEvent
	var lost int64
	stale, missing := 0, 0
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		var l int64
		evs, l = f.Take(evs[:0])
		lost += l
		for _, e := range evs {
			if e.Op.Gone() {
				index[e.Key] = false
			}
		}
		if lost != 0 {
			t.Fatalf("the feed lost %d events", lost)
		}
		res := make([]store.Result, len(keys))
		if err := inner.Exists(context.Background(), keys, res); err != nil {
			t.Fatal(err)
		}
		stale, missing = 0, 0
		for i, k := range keys {
			switch held := res[i].Err == nil; {
			case index[k] && !held:
				stale++
			case !index[k] && held:
				missing++
			}
		}
		if stale == 0 && missing == 0 {
			return
		}
		select {
		case <-tick.C:
		case <-timer.C:
			t.Fatalf("the index built from the feed has %d stale and %d missing keys after %v, want 0 and 0", stale, missing, bound)
		}
	}
}

// leasedWatched is a watched store that is a store.Leaser too.
type leasedWatched struct{ *watched }

func (leasedWatched) Leases() store.Leases { return store.Leases{Get: true, TTL: time.Second} }

// TestWatchLeaser: the client of a store that is a store.Leaser and a
// store.Watcher is both, with the server's declaration.
func TestWatchLeaser(t *testing.T) {
	s := leasedWatched{&watched{Store: newMemstore(t)}}
	path := filepath.Join(t.TempDir(), "kv.sock")
	start(t, s, remote.ServerOptions{}, path)
	c := dial(t, path, remote.ClientOptions{})
	l, ok := c.(store.Leaser)
	if _, w := c.(store.Watcher); !ok || !w {
		t.Fatalf("the client of a store.Leaser and store.Watcher is a %T: want both", c)
	}
	if got, want := l.Leases(), s.Leases(); got != want {
		t.Errorf("Leases() = %+v, want %+v", got, want)
	}
	f, err := c.(store.Watcher).Watch(8)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s.Announce(ev(1, store.KeyExpired))
	if got, lost := takeAll(t, f, 1); len(got) != 1 || got[0] != ev(1, store.KeyExpired) || lost != 0 {
		t.Errorf("the client's feed took %v, lost %d; want %v", got, lost, ev(1, store.KeyExpired))
	}
}

// TestWatchClosed: a feed its reader closes while its connection waits
// for a frame ends the connection (at the server's next keepalive, within
// a second), and the server's feed with it.
func TestWatchClosed(t *testing.T) {
	w := &watched{Store: newMemstore(t)}
	path := filepath.Join(t.TempDir(), "kv.sock")
	logs := make(logRecords, 64)
	start(t, w, remote.ServerOptions{Logger: slog.New(logs)}, path)
	c := dial(t, path, remote.ClientOptions{})
	f, err := c.(store.Watcher).Watch(8)
	if err != nil {
		t.Fatal(err)
	}
	if !w.Watching() {
		t.Fatal("the server's store has no feed open after a client's Watch")
	}
	// An event taken: the client's connection waits for the next frame.
	w.Announce(ev(0, store.KeyRemoved))
	if got, lost := takeAll(t, f, 1); len(got) != 1 || lost != 0 {
		t.Fatalf("the client's feed took %v, lost %d; want the one event", got, lost)
	}
	f.Close()
	waitLog(t, logs, "remote: connection ended")
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for w.Watching() {
		select {
		case <-tick.C:
		case <-timer.C:
			t.Fatalf("the server's feed is still open %v after the client's was closed", bound)
		}
	}
}
