package storeconn_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// hungExists is a store whose exists probes hang, deaf to their deadline,
// until release is closed.
type hungExists struct {
	store.Store
	release chan struct{}
}

func (s hungExists) Exists(ctx context.Context, keys []string, res []store.Result) error {
	<-s.release
	return s.Store.Exists(ctx, keys, res)
}

// awaitWake waits for a value on c, failing after waitBound with what.
func awaitWake(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(waitBound):
		t.Fatalf("no wake-up in %v: %s", waitBound, what)
	}
}

// TestWorkerWakes: a worker signals once a transfer ended, and the Poll
// after the signal reports it.
func TestWorkerWakes(t *testing.T) {
	r := newRig(t, newMem(t), identity(1, 1), nil)
	w := r.ws[0]
	wake := w.(connector.Waker).Wake()
	req := request("a", 4*bs)
	if err := r.s.Scheduled(req, req.Prompt, blocks(4)); err != nil {
		t.Fatal(err)
	}
	m := r.s.Plan()
	if err := w.Start(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if err := w.Save(context.Background(), connector.Ready); err != nil {
		t.Fatal(err)
	}
	var done []uint64
	for d := newDeadline(t, "the save reported Done"); len(done) < len(m.Saves); d.tick() {
		awaitWake(t, wake, "a save of 4 blocks was started and never reported")
		done = append(done, w.Poll().Done...)
	}
	if len(done) != len(m.Saves) {
		t.Fatalf("Poll reported %v, want the %d saves", done, len(m.Saves))
	}
	if _, err := r.s.Update([]*connector.Output{{Done: done}}); err != nil {
		t.Fatal(err)
	}
}

// TestSchedulerWakesOnLookups: with lookups on the pool, a Match that
// answers Pending is followed by a wake-up after which Match answers:
// when the lookup returns, when the queue was full, and when the store
// hangs past the store timeout (a miss then).
func TestSchedulerWakesOnLookups(t *testing.T) {
	t.Run("answered", func(t *testing.T) {
		r := newRig(t, newMem(t), identity(1, 1), map[string]any{"lookup": "async", "lookup_workers": 1, "lookup_queue": 1})
		wake := r.s.(connector.Waker).Wake()
		pending := map[string]*connector.Request{}
		for i := range 6 {
			id := fmt.Sprintf("r%d", i)
			pending[id] = request(id, 4*bs+1)
		}
		// One worker, a queue of one: some Matches find it full.
		for d := newDeadline(t, "every lookup answered"); len(pending) > 0; d.tick() {
			for id, req := range pending {
				m, err := r.s.Match(req, 0)
				if err != nil {
					t.Fatal(err)
				}
				if !m.Pending {
					delete(pending, id)
				}
			}
			if len(pending) > 0 {
				awaitWake(t, wake, fmt.Sprintf("%d lookups pending", len(pending)))
			}
		}
	})
	t.Run("hung store", func(t *testing.T) {
		hung := hungExists{newMem(t), make(chan struct{})}
		var once sync.Once
		release := func() { once.Do(func() { close(hung.release) }) }
		t.Cleanup(release) // before the rig closes: cleanups run last first
		r := newRig(t, hung, identity(1, 1), map[string]any{"lookup": "async", "store_timeout": "30ms"})
		t.Cleanup(release)
		wake := r.s.(connector.Waker).Wake()
		req := request("a", 4*bs+1)
		start := time.Now()
		for d := newDeadline(t, "Match answered a miss past the store timeout"); ; d.tick() {
			m, err := r.s.Match(req, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !m.Pending {
				if m.Tokens != 0 {
					t.Fatalf("Match over a hung store = %+v, want a miss", m)
				}
				break
			}
			awaitWake(t, wake, "a lookup hangs in the store, past its 30ms deadline")
		}
		if d := time.Since(start); d < 30*time.Millisecond {
			t.Errorf("Match answered a miss after %v, before the 30ms store timeout", d)
		}
		release()
	})
}

// TestSchedulerWakesForRetries: an Update that leaves out-of-space saves
// to retry in a later step leaves a value on the channel: only steps
// bring their turn.
func TestSchedulerWakesForRetries(t *testing.T) {
	full := storetest.NewFaulty(newMem(t), storetest.FaultOptions{Ops: storetest.OpPut, KeyRate: 1, PutErrors: []error{store.ErrNoSpace}})
	r := newRig(t, full, identity(1, 1), map[string]any{"save_retries": 2, "retry_steps": 3})
	wake := r.s.(connector.Waker).Wake()
	req := request("a", 4*bs+1)
	if err := r.s.Scheduled(req, req.Prompt, blocks(5)); err != nil {
		t.Fatal(err)
	}
	// Step until the failed saves are back in the scheduler half, then
	// drain the channel: the next Update must fill it again.
	r.until("the saves reported failed for lack of space", func(*connector.Progress) bool { return retriesWaiting(r) })
	select {
	case <-wake:
	default:
	}
	r.poll()
	select {
	case <-wake:
	default:
		t.Fatal("an Update that leaves retries waiting left no value on the channel")
	}
}

// retriesWaiting reports whether the last Update took failed saves that
// none of the Plans since has retried: with retry_steps 3 they wait.
func retriesWaiting(r *rig) bool {
	return r.s.(connector.StatsReporter).Stats().SaveRetries == 0 && len(r.outs) > 0 && len(r.outs[0].Failed) > 0
}

// gatedExists is a store whose first exists probe waits for release, and
// which counts its exists calls and the keys they asked about.
type gatedExists struct {
	store.Store
	entered chan struct{} // closed once the first probe is in the store
	release chan struct{}
	mu      sync.Mutex
	calls   []int // keys per call
}

func (s *gatedExists) Exists(ctx context.Context, keys []string, res []store.Result) error {
	s.mu.Lock()
	first := len(s.calls) == 0
	s.calls = append(s.calls, len(keys))
	s.mu.Unlock()
	if first {
		close(s.entered)
		<-s.release
	}
	return s.Store.Exists(ctx, keys, res)
}

// TestLookupsShareACall: the lookups queued while the pool's goroutine
// waits on the store are probed together, in one exists call, and each
// is answered from its own part of it.
func TestLookupsShareACall(t *testing.T) {
	st := &gatedExists{Store: newMem(t), entered: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(st.release) }) }
	r := newRig(t, st, identity(1, 1), map[string]any{"lookup": "async", "lookup_workers": 1, "store_timeout": "10m"})
	t.Cleanup(release) // before the rig closes: cleanups run last first
	// Four requests of distinct prompts; the store holds the first 2
	// blocks of "c".
	distinct := func(id string, n int, seed hashing.Token) *connector.Request {
		toks := make([]hashing.Token, n)
		for i := range toks {
			toks[i] = seed*1000003 + hashing.Token(i)
		}
		hs, err := hashing.HashBlocks(bs, toks)
		if err != nil {
			t.Fatal(err)
		}
		return &connector.Request{ID: connector.RequestID(id), Prompt: n, Hashes: hs}
	}
	a, b, c, d := distinct("a", 4*bs+1, 1), distinct("b", 4*bs+1, 2), distinct("c", 4*bs+1, 3), distinct("d", 8*bs+1, 4)
	saver := distinct("saver", 2*bs, 3)
	if saver.Hashes[1] != c.Hashes[1] {
		t.Fatal("the saver's blocks are not c's")
	}
	r.saveAll(saver) // saves probe nothing: the first exists call is a's

	reqs := []*connector.Request{a, b, c, d}
	m, err := r.s.Match(reqs[0], 0)
	if err != nil || !m.Pending {
		t.Fatalf("Match(a) = %+v, %v: want Pending", m, err)
	}
	select {
	case <-st.entered:
	case <-time.After(waitBound):
		t.Fatalf("the first lookup did not reach the store in %v", waitBound)
	}
	for _, req := range reqs[1:] {
		if m, err := r.s.Match(req, 0); err != nil || !m.Pending {
			t.Fatalf("Match(%s) = %+v, %v: want Pending", req.ID, m, err)
		}
	}
	release()
	want := map[connector.RequestID]int{"a": 0, "b": 0, "c": 2 * bs, "d": 0}
	wake := r.s.(connector.Waker).Wake()
	for d := newDeadline(t, "every lookup answered"); len(want) > 0; d.tick() {
		for _, req := range reqs {
			w, ok := want[req.ID]
			if !ok {
				continue
			}
			m, err := r.s.Match(req, 0)
			if err != nil {
				t.Fatal(err)
			}
			if m.Pending {
				continue
			}
			if m.Tokens != w {
				t.Errorf("Match(%s) = %d tokens, want %d", req.ID, m.Tokens, w)
			}
			delete(want, req.ID)
		}
		if len(want) > 0 {
			awaitWake(t, wake, fmt.Sprintf("%d lookups pending", len(want)))
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.calls) != 2 || st.calls[1] != 4+4+8 {
		t.Errorf("exists calls asked for %v keys, want [4 16]: the 3 lookups queued behind the first share one call", st.calls)
	}
}
