//go:build unix

package p2p

import (
	"testing"

	"github.com/kvconnect/kvconnect/connector"
)

// TestWorkersFromMetadataAlone: a consumer's workers load from what the
// Metadata's bytes carry: the scheduler half that plans the load is not
// the one the workers were opened with (no state in common), and the
// Metadata reaches them encoded, as it reaches workers in other
// processes.
func TestWorkersFromMetadataAlone(t *testing.T) {
	base := opts(2, 1, 4, connector.BlockMajor)
	p, c := pair(t, base, base)
	tokens := prompt(121, 6*4)
	params := p.prefill("r", tokens)
	sched, _, err := New(connector.Config{Connector: Name, Role: connector.RoleConsumer}, connector.Env{Identity: c.id}, c.engines...)
	if err != nil {
		t.Fatal(err)
	}
	defer sched.Close()
	r := c.newReq("r", tokens)
	r.conn.TransferParams = params
	m, err := sched.Match(&r.conn, 0)
	if err != nil || m.Tokens != 20 {
		t.Fatalf("Match = %+v, %v; want 20 tokens", m, err)
	}
	for range 6 {
		r.blocks = append(r.blocks, c.alloc())
	}
	if err := sched.Allocated(&r.conn, m.Tokens, r.blocks); err != nil {
		t.Fatal(err)
	}
	data, err := sched.Plan().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var meta connector.Metadata
	if err := meta.UnmarshalBinary(data); err != nil {
		t.Fatal(err)
	}
	for rank, w := range c.workers {
		if err := w.Start(t.Context(), &meta); err != nil {
			t.Fatalf("worker %d: Start(decoded Metadata) = %v", rank, err)
		}
	}
	loaded := false
	waitFor(t, "the load planned by another scheduler half", func() bool {
		outs := make([]*connector.Output, len(c.workers))
		for i, w := range c.workers {
			outs[i] = w.Poll()
		}
		prog, err := sched.Update(outs)
		if err != nil {
			t.Fatalf("Update: %v", err)
		}
		if len(prog.Failed) > 0 {
			t.Fatalf("load failed: %+v", prog.Failed)
		}
		loaded = loaded || len(prog.Loaded) == 1
		return loaded
	})
	for i := range 5 {
		c.check("loaded", r.blocks[i], r.conn.Hashes[i])
	}
	settleFor(t, "the producer to release the blocks", func() bool { return len(p.kept) == 0 }, p)
}
