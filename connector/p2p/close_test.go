//go:build unix

package p2p

import (
	"errors"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/rdma"
)

// TestCloseUnsettled: a worker's Close does not wait past close_timeout
// for a transfer that never settles (a dead peer whose transport does not
// give up): it returns an error wrapping rdma.ErrBusy, the load is never
// reported, and the memory the transfer may write is retired (neither
// released nor freed).
func TestCloseUnsettled(t *testing.T) {
	h := newHold()
	co := opts(1, 1, 4, connector.BlockMajor)
	co.extra = map[string]any{"close_timeout": "1ms"} // the held transfer never settles: any bound is passed
	co.wrap = func(_ int, e rdma.Engine) rdma.Engine { return holding{e, h} }
	p, c := pair(t, opts(1, 1, 4, connector.BlockMajor), co)
	tokens := prompt(101, 6*4)
	r, _ := c.admit("r", tokens, p.prefill("r", tokens), 0)
	c.step(nil) // starts the load, whose block reads are held
	waitFor(t, "the load's block reads to be submitted", func() bool { return closed(h.submitted) })
	w := c.workers[0]
	errc := make(chan error, 1)
	go func() { errc <- w.Close() }()
	var err error
	select {
	case err = <-errc:
	case <-time.After(20 * time.Second):
		// Let the held reads run, so that the Close under way ends.
		t.Cleanup(func() { h.run(t) })
		t.Fatalf("Close did not return within 20 s with close_timeout 1ms and a transfer that never settles")
	}
	if !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("Close with a transfer that never settles = %v, want an error wrapping rdma.ErrBusy", err)
	}
	c.unsettled = true
	if err := w.Close(); !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("a second Close while the transfer is still unsettled = %v, want an error wrapping rdma.ErrBusy: nil would tell the engine it may free the KV memory", err)
	}
	if n := w.unsettled(); n != 1 {
		t.Errorf("%d loads left unreported, want 1", n)
	}
	if out := w.Poll(); len(out.Done) != 0 || len(out.Failed) != 0 {
		t.Errorf("Poll after Close reports %v done, %d failed: the load whose reads never settled was reported", out.Done, len(out.Failed))
	}
	if r.loaded || r.failed != nil {
		t.Errorf("the load was reported (loaded %v, failed %+v)", r.loaded, r.failed)
	}
	if h.wasReleased() {
		t.Errorf("the batch that never settled was released")
	}
	if w.scratch == nil || w.mailbox == nil {
		t.Errorf("Close freed the scratch or the mailbox a transfer that never settled may write")
	}
}
