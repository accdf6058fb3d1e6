package shm

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
)

// waitFor waits, 30 s at most, until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30 s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOwnerWaitsForGrants checks that the owner's Unregister and Close
// wait for a peer's copy that was granted the memory: when they return,
// the peer's write has landed, and nothing moves afterwards.
func TestOwnerWaitsForGrants(t *testing.T) {
	for _, op := range []string{"Unregister", "Close"} {
		t.Run(op, func(t *testing.T) {
			a, err := New(&Options{Workers: 1})
			if err != nil {
				t.Fatal(err)
			}
			b, err := New(nil)
			if err != nil {
				t.Fatal(err)
			}
			am, err := a.Alloc(4096)
			if err != nil {
				t.Fatal(err)
			}
			bm, err := b.Alloc(4096)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				for _, c := range []func() error{a.Close, b.Close, am.Free, bm.Free} {
					if err := c(); err != nil {
						t.Error(err)
					}
				}
			})
			want := bytes.Repeat([]byte{0x5C}, 4096)
			copy(am.Bytes(), want)
			for _, x := range []struct {
				e *Engine
				m *Memory
			}{{a, am}, {b, bm}} {
				if err := x.e.Register(x.m.Region()); err != nil {
					t.Fatal(err)
				}
			}
			entered, release := make(chan struct{}), make(chan struct{})
			a.hooks.granted = func() {
				close(entered)
				<-release
			}
			seg, err := a.Open(context.Background(), b.Segment())
			if err != nil {
				t.Fatal(err)
			}
			batch, err := a.NewBatch(1)
			if err != nil {
				t.Fatal(err)
			}
			if err := batch.Submit([]rdma.Request{{Op: rdma.Write, Local: am.Region(), Segment: seg, Remote: bm.Region().Addr}}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-entered:
			case <-time.After(30 * time.Second):
				t.Fatal("waited 30 s for the worker to hold its grant")
			}
			// The owner withdraws the memory while the peer holds a grant.
			landed := make(chan bool, 1)
			go func() {
				var err error
				if op == "Unregister" {
					err = b.Unregister(bm.Region())
				} else {
					err = b.Close()
				}
				if err != nil {
					t.Error(err)
				}
				landed <- bytes.Equal(bm.Bytes(), want)
			}()
			waitFor(t, op+" to begin", func() bool {
				b.reg.Lock()
				defer b.reg.Unlock()
				return b.reg.closed || !b.reg.set.Contains(bm.Region())
			})
			close(release)
			select {
			case ok := <-landed:
				if !ok {
					t.Errorf("%s returned before the copy it had granted was done", op)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("waited 30 s for %s", op)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := batch.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if r := batch.Result(0); r.Status != rdma.Completed {
				t.Errorf("the granted write = %+v, want completed", r)
			}
			// Later requests to the withdrawn memory fail.
			if err := batch.Release(); err != nil {
				t.Fatal(err)
			}
			a.hooks.granted = nil
			again, err := a.NewBatch(1)
			if err != nil {
				t.Fatal(err)
			}
			if err := again.Submit([]rdma.Request{{Op: rdma.Read, Local: am.Region(), Segment: seg, Remote: bm.Region().Addr}}); err != nil {
				t.Fatal(err)
			}
			if err := again.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if r := again.Result(0); r.Status != rdma.Failed {
				t.Errorf("a read after %s = %+v, want failed", op, r)
			}
		})
	}
}
