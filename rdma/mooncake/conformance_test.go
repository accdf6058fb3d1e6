//go:build linux

package mooncake

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/rdmatest"
)

// fakePair opens two engines on the fake library.
func fakePair(t testing.TB) (rdma.Engine, rdma.Engine) {
	return openFake(t, nil), openFake(t, nil)
}

// fakeLatePair opens two engines on the fake library whose first
// engine's tasks are late: reported TIMEOUT a few times, then run.
func fakeLatePair(t testing.TB) (rdma.Engine, rdma.Engine) {
	h := fakeHooks(t)
	a := openFake(t, nil)
	h.late(a.handle, 3)
	return a, openFake(t, nil)
}

// loopbackPair opens two loopback engines, the base of the broken
// engines below.
func loopbackPair(t testing.TB) (rdma.Engine, rdma.Engine) {
	f := rdma.NewFabric()
	var es [2]rdma.Engine
	for i := range es {
		e, err := f.NewEngine(fmt.Sprintf("e%d", i), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := e.Close(); err != nil {
				t.Error(err)
			}
		})
		es[i] = e
	}
	return es[0], es[1]
}

func TestConformanceFake(t *testing.T) {
	rdmatest.Run(t, fakePair, rdmatest.Options{Late: fakeLatePair})
}

// TestConformanceReal runs the checks on two engines of a real Mooncake
// Transfer Engine library over tcp on 127.0.0.1, when
// MOONCAKE_TRANSFER_ENGINE_LIBRARY names one.
func TestConformanceReal(t *testing.T) {
	cfg := realConfig(t)
	rdmatest.Run(t, func(t testing.TB) (rdma.Engine, rdma.Engine) {
		var es [2]rdma.Engine
		for i := range es {
			e, err := Open(context.Background(), cfg)
			if err != nil {
				t.Fatalf("Open(real) = %v", err)
			}
			t.Cleanup(func() {
				if err := e.Close(); err != nil {
					t.Error(err)
				}
			})
			es[i] = e
		}
		return es[0], es[1]
	}, rdmatest.Options{})
}

// realConfig returns the config of a real library from the environment,
// or skips saying what to set.
func realConfig(t testing.TB) Config {
	t.Helper()
	lib := os.Getenv(EnvLibrary)
	if lib == "" {
		t.Skipf("no real Mooncake Transfer Engine: set %s to a libtransfer_engine.so (Mooncake built with -DBUILD_SHARED_LIBS=ON) to run this", EnvLibrary)
	}
	host := os.Getenv(EnvLocalHostname)
	if host == "" {
		host = "127.0.0.1"
	}
	return Config{Library: lib, Hostname: host}
}

// Broken engines, to prove that the checks can fail.

const brokenEnv = "MOONCAKE_CONFORMANCE_BROKEN"

type brokenEngine struct {
	rdma.Engine
	how string
}

func (e brokenEngine) NewBatch(n int) (rdma.Batch, error) {
	b, err := e.Engine.NewBatch(n)
	if err != nil {
		return nil, err
	}
	return brokenBatch{b, e.how}, nil
}

type brokenBatch struct {
	rdma.Batch
	how string
}

func (b brokenBatch) Submit(reqs []rdma.Request) error {
	switch b.how {
	case "off-by-one":
		// Writes one byte past the address asked for.
		reqs = append([]rdma.Request(nil), reqs...)
		for i := range reqs {
			reqs[i].Remote++
		}
	case "no-check":
		// Submits what it can, one request at a time, and drops the
		// errors: the breakage under test.
		for _, r := range reqs {
			b.Batch.Submit([]rdma.Request{r})
		}
		return nil
	}
	return b.Batch.Submit(reqs)
}

func (b brokenBatch) Result(i int) rdma.Result {
	r := b.Batch.Result(i)
	if b.how == "always-completed" && r.Status.Final() {
		r.Status = rdma.Completed
	}
	if b.how == "early-final" && r.Status == rdma.Pending {
		// Takes a transport's timeout report for an end, as the
		// binding once did.
		r.Status = rdma.Timeout
	}
	return r
}

func (b brokenBatch) Wait(ctx context.Context) error {
	if b.how == "early-final" {
		_, err := b.Batch.Poll()
		return err
	}
	return b.Batch.Wait(ctx)
}

func (b brokenBatch) Release() error {
	err := b.Batch.Release()
	if b.how == "early-final" && errors.Is(err, rdma.ErrBusy) {
		return nil // dropped: freed later, or by Close
	}
	return err
}

// TestConformanceBrokenTarget runs the checks on one broken engine; it is
// run in a child process by TestConformanceCatchesBrokenEngines.
func TestConformanceBrokenTarget(t *testing.T) {
	how := os.Getenv(brokenEnv)
	if how == "" {
		t.Skip("run by TestConformanceCatchesBrokenEngines in a child process")
	}
	rdmatest.Run(t, func(t testing.TB) (rdma.Engine, rdma.Engine) {
		a, b := loopbackPair(t)
		return brokenEngine{a, how}, b
	}, rdmatest.Options{Late: func(t testing.TB) (rdma.Engine, rdma.Engine) {
		a, b := fakeLatePair(t)
		return brokenEngine{a, how}, b
	}})
}

// TestConformanceCatchesBrokenEngines proves that the checks can fail.
func TestConformanceCatchesBrokenEngines(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("in a child process")
	}
	for _, c := range []struct{ how, want string }{
		{"off-by-one", "differs from the expected bytes"},
		{"always-completed", "want failed"},
		{"no-check", "Submit = <nil>"},
		{"early-final", "changed after Wait returned"},
	} {
		t.Run(c.how, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestConformanceBrokenTarget$", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+c.how)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the checks passed the %s engine:\n%s", c.how, out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Errorf("the checks failed the %s engine, but not with %q:\n%s", c.how, c.want, out)
			}
		})
	}
}
