//go:build linux

package p2p

import (
	"context"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/internal/fakelib"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/mooncake"
)

// TestMooncakeLate runs loads over rdma/mooncake engines on the fake
// Transfer Engine library (rdma/mooncake's testdata), every task of which
// is late: Mooncake reports it TIMEOUT a few times, then it moves its
// bytes. The loads are reported only once their bytes are there, byte
// for byte (the test's engine checks every block reported loaded), and
// nothing writes a block after its request freed it.
func TestMooncakeLate(t *testing.T) {
	lib := fakelib.Build("libtransfer_engine.so", []string{"../../rdma/mooncake/testdata/fake_transfer_engine.c"}, "-lpthread")
	t.Cleanup(func() {
		if err := lib.Remove(); err != nil {
			t.Error(err)
		}
	})
	path := lib.Need(t, "MOONCAKE_FAKE_REQUIRE")
	t.Setenv("FAKE_TRANSFER_ENGINE_LATE", "3")
	open := func(int) rdma.Engine {
		e, err := mooncake.Open(context.Background(), mooncake.Config{Library: path, Hostname: "127.0.0.1", CloseTimeout: 10 * time.Second})
		if err != nil {
			t.Fatalf("mooncake.Open(fake) = %v", err)
		}
		return e
	}
	for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
		t.Run(order.String(), func(t *testing.T) {
			po, co := opts(2, 1, 4, order), opts(2, 1, 4, order)
			po.engine, co.engine = open, open
			p, c := pair(t, po, co)
			for i, id := range []string{"r1", "r2"} {
				tokens := prompt(71+100*i, 6*4)
				params := p.prefill(id, tokens)
				r, matched := c.admit(id, tokens, params, 0)
				if matched != 20 {
					t.Fatalf("%s: matched %d, want 20", id, matched)
				}
				settle(t, func() bool { return r.loaded || r.failed != nil }, c, p)
				if r.failed != nil {
					t.Fatalf("%s: load over late Mooncake tasks failed: %+v", id, *r.failed)
				}
				c.finish(r)
			}
			settle(t, func() bool { return len(p.kept) == 0 }, c, p)
			for _, b := range c.free {
				if !c.isPoisoned(b) {
					t.Errorf("consumer block %d was written after it was freed", b)
				}
			}
		})
	}
}
