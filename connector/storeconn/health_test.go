package storeconn_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
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
	if err := r.s.Allocated(b, blocks(5), m.Tokens); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	_, fails := r.load2()
	if len(fails) != 1 || fails[0].Valid != 0 {
		t.Fatalf("load with the store closed: failures %+v, want one with 0 valid tokens", fails)
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
}

func (h hung) Exists(ctx context.Context, keys []string, res []store.Result) error {
	<-h.release
	return h.Store.Exists(ctx, keys, res)
}

func (h hung) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
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
