package driver

import (
	"github.com/kvconnect/kvconnect/hashing"

	"github.com/kvconnect/kvconnect/connector"
)

// PlanBuffer holds the Metadata a scheduler half fills during a step and
// hands out at its Plan, double-buffered, for connector implementations:
// the Metadata handed out stays valid until the next HandOut while the
// next one fills. The handed-out Metadata's blocks, hashes and params are copies,
// in space reused every other step, so the engine reading (or, against
// the contract, writing) them never touches the slices the connector keeps
// in its own records of the transfers. The zero PlanBuffer is ready to
// use. A PlanBuffer is not safe for concurrent use.
type PlanBuffer struct {
	bufs   [2]connector.Metadata
	arenas [2]planArena
	cur    int
}

// planArena holds the copies of one Metadata's blocks, hashes and params.
type planArena struct {
	blocks []connector.BlockID
	hashes []hashing.BlockHash
	params []byte
}

// Filling returns the Metadata of the step being planned, for the
// connector to append its transfers to and to set its Step and
// Generation. It is the same Metadata until HandOut.
func (b *PlanBuffer) Filling() *connector.Metadata { return &b.bufs[b.cur] }

// HandOut returns the filled Metadata, its blocks and hashes copied, and
// starts the next one, empty, with the same Step and Generation. After
// the first steps it does not allocate.
func (b *PlanBuffer) HandOut() *connector.Metadata {
	m := &b.bufs[b.cur]
	a := &b.arenas[b.cur]
	a.blocks, a.hashes, a.params = a.blocks[:0], a.hashes[:0], a.params[:0]
	for _, list := range [2][]connector.Transfer{m.Loads, m.Saves} {
		for i := range list {
			t := &list[i]
			nb, nh, np := len(a.blocks), len(a.hashes), len(a.params)
			a.blocks = append(a.blocks, t.Blocks...)
			a.hashes = append(a.hashes, t.Hashes...)
			// Earlier copies keep the array they were made in when a
			// later append moves on to a bigger one: each is whole.
			t.Blocks = a.blocks[nb:len(a.blocks):len(a.blocks)]
			t.Hashes = a.hashes[nh:len(a.hashes):len(a.hashes)]
			if t.Params != nil {
				a.params = append(a.params, t.Params...)
				t.Params = a.params[np:len(a.params):len(a.params)]
			}
		}
	}
	b.cur = 1 - b.cur
	next := &b.bufs[b.cur]
	next.Reset()
	next.Step, next.Generation = m.Step, m.Generation
	return m
}
