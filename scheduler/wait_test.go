package scheduler

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// TestIdle: Idle holds after a step that planned nothing, until news: an
// Add, or a Done whose connector reports a load.
func TestIdle(t *testing.T) {
	h := newHarness(t, testConfig(16, 4, 16), withConn)
	if !h.s.Idle() {
		t.Fatal("not Idle without a request")
	}
	pending := true
	h.conn.pending = func(connector.RequestID) bool { return pending }
	h.mustAdd("a", seq(1, 12), 1)
	if h.s.Idle() {
		t.Fatal("Idle after an Add, before the first step")
	}
	p := h.step()
	if len(p.Items) != 0 {
		t.Fatalf("step 1 plans %v while the lookup is pending", spans(p))
	}
	if h.s.Idle() {
		t.Fatal("Idle between Step and Done")
	}
	h.done(p, nil)
	if !h.s.Idle() {
		t.Fatal("not Idle after a step that planned nothing, with only a lookup-pending request")
	}
	h.mustAdd("b", seq(100, 6), 1)
	if h.s.Idle() {
		t.Fatal("Idle after an Add")
	}
	pending = false
	h.run(20)
	if !h.s.Idle() {
		t.Fatal("not Idle with no request left")
	}
}

// TestIdleAfterScheduledFailure: a request that ends while a step is
// planned (its Scheduled failed) frees its place for the next step: the
// scheduler is not Idle after that step, though it planned nothing.
func TestIdleAfterScheduledFailure(t *testing.T) {
	cfg := testConfig(16, 4, 16)
	cfg.MaxRunning = 1
	h := newHarness(t, cfg, withConn)
	h.mustAdd("a", seq(1, 6), 8)
	for range 3 {
		p := h.step()
		h.done(p, h.results(p))
	}
	h.mustAdd("b", seq(100, 6), 1)
	h.conn.inject = map[string]error{"Scheduled": errors.New("injected")}
	p := h.step()
	if len(p.Items) != 0 {
		t.Fatalf("step %d plans %v; want a dropped by its failed Scheduled, b not yet admitted", p.Step, spans(p))
	}
	h.done(p, nil)
	h.conn.inject = nil
	idle := h.s.Idle()
	p = h.step()
	if idle && len(p.Items) > 0 {
		t.Fatalf("Idle() was true, but the next step plans %v with no news", spans(p))
	}
	h.done(p, h.results(p))
}

// TestWaitEndToEnd: an engine over storeconn with lookups on the
// connector's pool and a store that takes 2 ms a call. Stepping without
// Wait it steps idle while lookups and transfers run; with Wait it
// blocks instead, each idle step then answers a wake-up, at most one per
// lookup and per transfer, and the outputs are the same.
func TestWaitEndToEnd(t *testing.T) {
	st := e2eStore(t)
	slow := storetest.NewFaulty(st, storetest.FaultOptions{Latency: 2 * time.Millisecond})
	cfg := Config{Identity: e2eIdentity(4), Blocks: 96, MaxBatchedTokens: 48, PrefixCaching: true}
	type result struct {
		out                         map[connector.RequestID][]hashing.Token
		idle, steps                 int
		lookups, transfers, retries int64
	}
	drive := func(tag string, wait bool) result {
		e := newMiniEngineLookup(t, slow, cfg, "async")
		workload(e, tag)
		var r result
		var wake []<-chan struct{}
		for _, w := range e.workers {
			wake = append(wake, w.(connector.Waker).Wake())
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		r.out = e.drain(func() (*Plan, error) {
			if wait {
				if err := e.s.Wait(ctx, wake...); err != nil {
					return nil, fmt.Errorf("Wait after step %d, idle %v: %w: no wake-up came", e.s.step, e.s.Idle(), err)
				}
			}
			p, err := e.step()
			if err == nil {
				r.steps++
				if len(p.Items) == 0 {
					r.idle++
				}
				r.transfers += int64(len(p.Metadata.Loads) + len(p.Metadata.Saves))
			}
			return p, err
		}, 64)
		cs := e.conn.(connector.StatsReporter).Stats()
		r.lookups, r.retries = cs.Lookups, cs.SaveRetries
		return r
	}
	spin := drive("s", false)
	st2 := e2eStore(t)
	slow = storetest.NewFaulty(st2, storetest.FaultOptions{Latency: 2 * time.Millisecond})
	waited := drive("s", true)
	t.Logf("12 requests: without Wait %d idle steps of %d (%.1f per request); with Wait %d of %d (%.1f per request), for %d lookups and %d transfers",
		spin.idle, spin.steps, float64(spin.idle)/12, waited.idle, waited.steps, float64(waited.idle)/12, waited.lookups, waited.transfers)
	if diff := diffOutputs(spin.out, waited.out); diff != "" {
		t.Fatalf("outputs with Wait differ from those without:\n%s", diff)
	}
	// Each idle step after a Wait answers a wake-up: a lookup that
	// answered, a transfer that ended, or the timer of a pending lookup
	// (with 2 ms calls, no lookup reaches the 5 s store timeout). Two
	// ranks report each transfer; a value may be left over from before a
	// step that found the news itself.
	if bound := 2 * (waited.lookups + 2*waited.transfers + waited.retries + 1); int64(waited.idle) > bound {
		t.Errorf("with Wait: %d idle steps, want at most %d (two per lookup, per transfer and rank, per retry)", waited.idle, bound)
	}
}

const waitBound = 2 * time.Minute

// TestWaitMisuse: Wait over a closed connector or worker, with a nil
// context, and with nothing to wait on returns an error at once instead
// of blocking until its context ends (a minute here: the test fails by
// that deadline when a case blocks).
func TestWaitMisuse(t *testing.T) {
	st := e2eStore(t)
	cfg := Config{Identity: e2eIdentity(4), Blocks: 16, MaxBatchedTokens: 16, PrefixCaching: true}
	for _, tc := range []struct {
		name string
		wait func(t *testing.T, ctx context.Context) error
		want error
	}{
		{"nil context", func(t *testing.T, _ context.Context) error {
			s, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s.Wait(nil) //nolint:staticcheck // the misuse under test
		}, ErrArgument},
		{"no connector and no wake channel", func(t *testing.T, ctx context.Context) error {
			s, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s.Wait(ctx)
		}, ErrArgument},
		{"only nil wake channels", func(t *testing.T, ctx context.Context) error {
			s, err := New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s.Wait(ctx, nil, nil)
		}, ErrArgument},
		{"connector closed", func(t *testing.T, ctx context.Context) error {
			e := newMiniEngineLookup(t, st, cfg, "async")
			if err := e.conn.Close(); err != nil {
				t.Fatal(err)
			}
			return e.s.Wait(ctx, e.wakes()...)
		}, connector.ErrClosed},
		{"worker closed", func(t *testing.T, ctx context.Context) error {
			e := newMiniEngineLookup(t, st, cfg, "async")
			if err := e.workers[1].Close(); err != nil {
				t.Fatal(err)
			}
			return e.s.Wait(ctx, e.wakes()...)
		}, connector.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := tc.wait(t, ctx); !errors.Is(err, tc.want) {
				t.Errorf("Wait = %v, want an error wrapping %v", err, tc.want)
			}
		})
	}
}
