package rdma

import (
	"context"
	"errors"
	"testing"
)

// TestBatchState: capacity, finishing, overlap with pending requests,
// waiting, and release while requests are pending or after Close.
func TestBatchState(t *testing.T) {
	b := NewBatchState(3)
	reqs := []Request{{Local: Region{Addr: 100, Len: 10}}, {Local: Region{Addr: 200, Len: 0}}}
	if first, err := b.Add(reqs); err != nil || first != 0 {
		t.Fatalf("Add = %d, %v; want 0, nil", first, err)
	}
	if _, err := b.Add(reqs); !errors.Is(err, ErrBatchFull) || b.Len() != 2 {
		t.Fatalf("Add past the capacity = %v with %d requests; want ErrBatchFull and nothing reserved", err, b.Len())
	}
	if i := b.PendingIn(Region{Addr: 105, Len: 1}); i != 0 {
		t.Errorf("PendingIn over request 0's memory = %d, want 0", i)
	}
	if i := b.PendingIn(Region{Addr: 200, Len: 8}); i != -1 {
		t.Errorf("PendingIn over a request of no bytes = %d, want -1", i)
	}
	if _, err := b.Release(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Release while pending = %v, want ErrBusy", err)
	}
	b.Finish(0, Completed, 10)
	if done, _ := b.Poll(); done {
		t.Fatal("Poll reports done with request 1 pending")
	}
	b.Finish(1, Failed, 0)
	if err := b.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := b.Result(0); r != (Result{Status: Completed, Bytes: 10}) || b.Result(1).Status != Failed {
		t.Errorf("results %+v, %+v", r, b.Result(1))
	}
	if i := b.PendingIn(Region{Addr: 105, Len: 1}); i != -1 {
		t.Errorf("PendingIn after every request finished = %d, want -1", i)
	}
	// An empty submission reserves nothing and leaves nothing to wait on.
	if _, err := b.Add(nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Release(); !ok || err != nil {
		t.Fatalf("Release = %v, %v; want true, nil", ok, err)
	}
	if ok, err := b.Release(); ok || err != nil {
		t.Fatalf("a second Release = %v, %v; want false, nil", ok, err)
	}
	if _, err := b.Add(reqs[:1]); !errors.Is(err, ErrClosed) {
		t.Fatalf("Add after Release = %v, want ErrClosed", err)
	}
	c := NewBatchState(1)
	c.Close()
	if _, err := c.Add(reqs[:1]); !errors.Is(err, ErrClosed) {
		t.Fatalf("Add after Close = %v, want ErrClosed", err)
	}
}
