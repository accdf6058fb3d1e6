package connectortest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/connectortest"
	"github.com/kvconnect/kvconnect/connector/p2p"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

const brokenEnv = "CONNECTORTEST_BROKEN"

func newStore() (store.Store, error) { return memstore.New(memstore.Config{Capacity: 8 << 20}) }

// open opens the reference connector, with the named breakage wrapped
// around it ("" for none).
func open(broken string) connectortest.OpenFunc {
	cfg := connector.Config{Connector: storeconn.Name}
	return func(env connector.Env) (connectortest.Pair, error) {
		var p connectortest.Pair
		s, err := connector.OpenScheduler(cfg, env)
		if err != nil {
			return p, err
		}
		switch broken {
		case "last-token":
			s = lastToken{s.(*storeconn.Scheduler), env.Identity.Layout.BlockSize}
		case "ignores-rotation":
			s = ignoresRotation{s}
		}
		p.Scheduler = s
		for rank := range env.Identity.Layout.TPSize {
			env.Rank = rank
			w, err := connector.OpenWorker(cfg, env)
			if err != nil {
				return p, err
			}
			switch broken {
			case "early-load":
				w = &earlyLoad{Worker: w}
			case "drops-failed":
				w = dropsFailed{w}
			}
			p.Workers = append(p.Workers, w)
		}
		return p, nil
	}
}

// earlyLoad reports every load done at once, and never runs it.
type earlyLoad struct {
	connector.Worker
	done []uint64
	out  connector.Output
}

func (w *earlyLoad) Start(ctx context.Context, m *connector.Metadata) error {
	for _, t := range m.Loads {
		w.done = append(w.done, t.ID)
	}
	noLoads := *m
	noLoads.Loads = nil
	return w.Worker.Start(ctx, &noLoads)
}

func (w *earlyLoad) Poll() *connector.Output {
	o := w.Worker.Poll()
	w.out = connector.Output{Rank: o.Rank, Done: append(append([]uint64(nil), o.Done...), w.done...), Failed: o.Failed}
	w.done = w.done[:0]
	return &w.out
}

// dropsFailed reports failed blocks as done.
type dropsFailed struct{ connector.Worker }

func (w dropsFailed) Poll() *connector.Output {
	o := w.Worker.Poll()
	o.Failed = o.Failed[:0]
	return o
}

// lastToken matches the block holding the last prompt token too, when the
// store has it.
type lastToken struct {
	*storeconn.Scheduler
	bs int
}

func (s lastToken) Match(r *connector.Request, computed int) (connector.Match, error) {
	m, err := s.Scheduler.Match(r, computed)
	if err == nil && m.Tokens > 0 && r.Prompt%s.bs == 0 && computed+m.Tokens == r.Prompt-s.bs {
		m.Tokens += s.bs
	}
	return m, err
}

// ignoresRotation accepts Rotate and does nothing.
type ignoresRotation struct{ connector.Scheduler }

func (ignoresRotation) Rotate(uint64) error { return nil }

// openP2P opens the producer and consumer halves of the p2p connector on one
// loopback fabric, with the named breakage wrapped around the consumer.
func openP2P(t *testing.T, broken string) (prod, cons connectortest.OpenFunc) {
	f := rdma.NewFabric()
	n := 0
	role := func(r connector.Role) connectortest.OpenFunc {
		return func(env connector.Env) (connectortest.Pair, error) {
			var engines []rdma.Engine
			for rank := range env.Identity.Layout.TPSize {
				n++
				e, err := f.NewEngine(fmt.Sprintf("%s-%d-%d", r, n, rank), nil)
				if err != nil {
					return connectortest.Pair{}, err
				}
				t.Cleanup(func() { e.Close() })
				engines = append(engines, e)
			}
			// A short keep_timeout: a broken consumer that never reads leaves
			// offers that only the timeout releases.
			cfg := connector.Config{Connector: p2p.Name, Role: r, Extra: map[string]any{"keep_timeout": "1s"}}
			s, ws, err := p2p.New(cfg, env, engines...)
			if err != nil {
				return connectortest.Pair{}, err
			}
			p := connectortest.Pair{Scheduler: s}
			if r == connector.RoleConsumer && broken == "p2p-last-token" {
				p.Scheduler = lastTokenP2P{s, env.Identity.Layout.BlockSize}
			}
			for _, w := range ws {
				var cw connector.Worker = w
				if r == connector.RoleConsumer && broken == "p2p-early-load" {
					cw = &earlyLoad{Worker: w}
				}
				p.Workers = append(p.Workers, cw)
			}
			return p, nil
		}
	}
	return role(connector.RoleProducer), role(connector.RoleConsumer)
}

// lastTokenP2P matches the block holding the last prompt token too, when
// the producer offered it.
type lastTokenP2P struct {
	*p2p.Scheduler
	bs int
}

func (s lastTokenP2P) Match(r *connector.Request, computed int) (connector.Match, error) {
	m, err := s.Scheduler.Match(r, computed)
	if err == nil && m.Tokens > 0 && r.Prompt%s.bs == 0 && computed+m.Tokens == r.Prompt-s.bs {
		m.Tokens += s.bs
	}
	return m, err
}

// TestStoreConnector runs the harness on the reference connector: it must
// pass.
func TestStoreConnector(t *testing.T) {
	connectortest.Run(t, open(""), connectortest.Options{NewStore: newStore})
}

// TestBrokenTarget runs the harness on one broken connector; it is run in a
// child process by TestHarnessCatchesBrokenConnectors, and must fail there.
func TestBrokenTarget(t *testing.T) {
	broken := os.Getenv(brokenEnv)
	if broken == "" {
		t.Skip("run by TestHarnessCatchesBrokenConnectors in a child process")
	}
	if strings.HasPrefix(broken, "p2p-") {
		prod, cons := openP2P(t, broken)
		connectortest.Run(t, prod, connectortest.Options{NewStore: newStore, OpenConsumer: cons})
		return
	}
	connectortest.Run(t, open(broken), connectortest.Options{NewStore: newStore})
}

// TestHarnessCatchesBrokenConnectors proves that the harness can fail: each
// broken connector must make it fail, for the reason given.
func TestHarnessCatchesBrokenConnectors(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("in a child process")
	}
	cases := []struct{ broken, want string }{
		{"early-load", "never written (still poisoned)"},
		{"last-token", "covers the last prompt token"},
		{"ignores-rotation", "Plan().Generation"},
		{"drops-failed", "bytes differ from the KV saved for its key"},
		{"p2p-early-load", "never written (still poisoned)"},
		{"p2p-last-token", "covers the last prompt token"},
	}
	for _, c := range cases {
		t.Run(c.broken, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenTarget$", "-test.count=1",
				"-rapid.checks=300", "-rapid.shrinktime=2s", "-rapid.nofailfile")
			cmd.Env = append(os.Environ(), brokenEnv+"="+c.broken)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the harness passed the %s connector:\n%s", c.broken, out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Errorf("the harness failed the %s connector, but not with %q:\n%s", c.broken, c.want, tail(string(out), 3000))
			}
		})
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
