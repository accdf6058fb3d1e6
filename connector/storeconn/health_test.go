package storeconn_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// TestStoreOutageVisible: with the store closed under an open connector,
// inference goes on (a lookup is a miss, a load a failed block), and the
// outage shows in Stats, in a warn line and in Health.
func TestStoreOutageVisible(t *testing.T) {
	st := newMem(t)
	var logs logBuf
	log := slog.New(slog.NewTextHandler(&logs, nil))
	r := newRigLog(t, st, identity(1, 1), map[string]any{"lookup": "sync"}, connector.BlockMajor, log)
	r.saveAll(request("a", 4*bs+1))
	b := request("b", 4*bs+1)
	m, err := r.s.Match(b, 0)
	if err != nil || m.Tokens != 4*bs {
		t.Fatalf("Match = %+v, %v", m, err)
	}
	if err := r.s.Allocated(b, m.Tokens, blocks(5)); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	_, fails := r.load2()
	if len(fails) != 1 || fails[0].Valid != 0 {
		t.Fatalf("load with the store closed: failures %+v, want one with 0 valid tokens", fails)
	}
	if ws := r.ws[0].(connector.StatsReporter).Stats(); ws.LoadFailures != 4 || ws.Loads != 0 {
		t.Errorf("worker Stats: LoadFailures = %d, Loads = %d after a get of 4 blocks failed as a whole, want 4, 0", ws.LoadFailures, ws.Loads)
	}
	if m, err := r.s.Match(request("c", 4*bs+1), 0); err != nil || m.Tokens != 0 || m.Pending {
		t.Fatalf("Match with the store closed = %+v, %v; want a miss and no error", m, err)
	}
	for _, half := range []struct {
		name string
		v    any
	}{{"scheduler", r.s}, {"worker", r.ws[0]}} {
		st := half.v.(connector.StatsReporter).Stats()
		h := half.v.(connector.HealthReporter).Health()
		if st.StoreErrors == 0 || h.Healthy() || h.ConsecutiveFailures == 0 || !errors.Is(h.LastError, store.ErrClosed) || h.LastErrorTime.IsZero() {
			t.Errorf("%s: StoreErrors = %d, Health = %+v; want failures counted and the last error wrapping store.ErrClosed", half.name, st.StoreErrors, h)
		}
	}
	out := logs.String()
	for _, want := range []string{"level=WARN", "op=exists", "store: closed"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// load2 steps until the load started by an earlier Allocated ends.
func (r *rig) load2() (loaded bool, fails []connector.LoadFailure) {
	r.t.Helper()
	r.until("the end of the load", func(p *connector.Progress) bool {
		fails = append(fails, p.Failed...)
		loaded = loaded || len(p.Loaded) > 0
		return loaded || len(fails) > 0
	})
	return loaded, fails
}

// hung is a store whose Exists and Get never return until released, and
// ignore their context: a store that hangs.
type hung struct {
	store.Store
	release chan struct{}
	entered chan struct{} // when set, gets one value when a Get first blocks
}

func (h hung) Exists(ctx context.Context, keys []string, res []store.Result) error {
	<-h.release
	return h.Store.Exists(ctx, keys, res)
}

func (h hung) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	<-h.release
	return h.Store.Get(ctx, keys, dst, res)
}

// TestHungStore: a store whose calls hang makes lookups miss once the
// store timeout has passed, counts the timeouts, and Close returns.
func TestHungStore(t *testing.T) {
	h := hung{Store: newMem(t), release: make(chan struct{})}
	t.Cleanup(func() { close(h.release) })
	r := newRigLog(t, h, identity(1, 1), map[string]any{"store_timeout": "20ms", "lookup_workers": 1}, connector.BlockMajor, nil)
	deadline := time.Now().Add(time.Minute)
	for i, id := range []string{"a", "b", "c"} {
		req := request(id, 4*bs+1)
		for {
			m, err := r.s.Match(req, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !m.Pending {
				if m.Tokens != 0 {
					t.Fatalf("Match(%s) = %+v from a hung store", id, m)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Match(%s) (request %d) still pending after a minute of a hung store with a 20ms timeout", id, i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	st := r.s.(connector.StatsReporter).Stats()
	if st.StoreTimeouts == 0 || st.StoreErrors < st.StoreTimeouts {
		t.Errorf("StoreTimeouts = %d, StoreErrors = %d; want timeouts counted", st.StoreTimeouts, st.StoreErrors)
	}
	if hl := r.s.(connector.HealthReporter).Health(); !errors.Is(hl.LastError, context.DeadlineExceeded) {
		t.Errorf("Health().LastError = %v, want a deadline error", hl.LastError)
	}
	done := make(chan error, 1)
	go func() { done <- r.s.Close() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "ignores its deadlines") {
			t.Errorf("Close with a lookup stuck in the store = %v, want an error saying so", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close blocked for a minute behind a hung store")
	}
}

// deadSegment is a store whose Exists finds keys whose Get then fails, as
// Mooncake does for keys in the segment of a client that died, until the
// master notices.
type deadSegment struct {
	store.Store
	dead chan struct{} // closed when the segment dies
}

func (d *deadSegment) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	select {
	case <-d.dead:
		for i := range res {
			res[i] = store.Result{Err: store.ErrTransfer}
		}
		return nil
	default:
		return d.Store.Get(ctx, keys, dst, res)
	}
}

// TestFailedKeysNotPlanned: once the loads of some blocks fail, lookups
// stop planning loads of them for failed_ttl, and count what they skip;
// after failed_ttl they plan them again. (Two rigs: one whose failed_ttl
// no pause of a loaded machine outlasts, for the skipping, and one whose
// failed_ttl passes, for the end of it.)
func TestFailedKeysNotPlanned(t *testing.T) {
	failLoad := func(t *testing.T, ttl string) *rig {
		d := &deadSegment{Store: newMem(t), dead: make(chan struct{})}
		r := newRigLog(t, d, identity(1, 1), map[string]any{"lookup": "sync", "failed_ttl": ttl}, connector.BlockMajor, nil)
		r.saveAll(request("a", 4*bs+1))
		close(d.dead)
		if loaded, fails := r.load("b"); loaded || len(fails) != 1 {
			t.Fatalf("load from a dead segment: loaded %v, failures %+v", loaded, fails)
		}
		return r
	}
	t.Run("Skipped", func(t *testing.T) {
		r := failLoad(t, "10m")
		if m, err := r.s.Match(request("c", 4*bs+1), 0); err != nil || m.Tokens != 0 {
			t.Fatalf("Match right after the failed load = %+v, %v; want a miss", m, err)
		}
		if n := r.s.(connector.StatsReporter).Stats().FailedSkipped; n != 4 {
			t.Errorf("FailedSkipped = %d, want 4", n)
		}
	})
	t.Run("PlannedAgain", func(t *testing.T) {
		r := failLoad(t, "50ms")
		deadline := time.Now().Add(time.Minute)
		for i := 0; ; i++ {
			m, err := r.s.Match(request(fmt.Sprint("d", i), 4*bs+1), 0)
			if err != nil {
				t.Fatal(err)
			}
			if m.Tokens == 4*bs {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("blocks whose load failed were still skipped a minute after a 50ms failed_ttl")
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// TestWorkerCloseHung: a worker whose load is stuck in a store call that
// ignores its deadline returns from Close with an error, again on every
// Close until the call ends, and nil once it has.
func TestWorkerCloseHung(t *testing.T) {
	base := newMem(t)
	r := newRigLog(t, base, identity(1, 1), map[string]any{"lookup": "sync", "store_timeout": "20ms"}, connector.BlockMajor, nil)
	r.saveAll(request("a", 4*bs+1))
	h := hung{Store: base, release: make(chan struct{}), entered: make(chan struct{}, 1)}
	cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"store_timeout": "20ms"}}
	w, err := connector.OpenWorker(cfg, connector.Env{Identity: identity(1, 1), Store: h})
	if err != nil {
		t.Fatal(err)
	}
	m, err := rdma.AllocHost(r.kv[0].Blocks * r.kv[0].BlockSize())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	kv := r.kv[0]
	kv.Regions = []rdma.Region{m.Region()}
	if err := w.Register(kv); err != nil {
		t.Fatal(err)
	}
	req := request("b", 4*bs+1)
	if err := w.Start(context.Background(), &connector.Metadata{Step: 1, Loads: []connector.Transfer{{ID: 1, Req: req.ID, Blocks: blocks(4), Hashes: req.Hashes}}}); err != nil {
		t.Fatal(err)
	}
	<-h.entered // the load is inside the store
	for range 2 {
		if err := w.Close(); err == nil || !strings.Contains(err.Error(), "transfers still running") {
			t.Fatalf("Close with a load stuck in the store = %v, want an error saying transfers still run", err)
		}
	}
	close(h.release)
	deadline := time.Now().Add(time.Minute)
	for {
		err := w.Close()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Close still failing a minute after the store answered: %v", err)
		}
	}
	if err := base.Register(m.Region()); err != nil {
		t.Errorf("the KV region is still registered after Close returned nil: %v", err)
	}
	base.Unregister(m.Region())
}
