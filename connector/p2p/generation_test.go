//go:build unix

package p2p

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
)

// TestRotateGeneration: generations only grow. A Rotate to the current or
// an older generation is an error naming both, and changes nothing.
func TestRotateGeneration(t *testing.T) {
	o := opts(1, 1, 4, connector.BlockMajor)
	o.gen = 2
	p, c := pair(t, o, o)
	for _, s := range []*Planner{p.sched, c.sched} {
		for _, gen := range []uint64{2, 1, 0} {
			err := s.Rotate(gen)
			if !errors.Is(err, connector.ErrGeneration) {
				t.Errorf("Rotate(%d) at generation 2 = %v, want ErrGeneration", gen, err)
				continue
			}
			for _, want := range []string{"generation " + strconv.FormatUint(gen, 10), "generation 2"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Rotate(%d) error %q does not name %q", gen, err, want)
				}
			}
		}
		if m := s.Plan(); m.Generation != 2 {
			t.Errorf("Plan().Generation after refused Rotates = %d, want 2", m.Generation)
		}
		if err := s.Rotate(5); err != nil {
			t.Fatalf("Rotate(5) at generation 2 = %v", err)
		}
		if m := s.Plan(); m.Generation != 5 {
			t.Errorf("Plan().Generation after Rotate(5) = %d, want 5", m.Generation)
		}
		if err := s.Rotate(4); !errors.Is(err, connector.ErrGeneration) || !strings.Contains(err.Error(), "generation 5") {
			t.Errorf("Rotate(4) at generation 5 = %v, want ErrGeneration naming generation 5", err)
		}
	}
}

// TestWorkerRefusesOlderGeneration: a worker refuses Metadata of a
// generation older than one it has seen (its identity's, or a later
// Metadata's), naming both, and starts nothing of it.
func TestWorkerRefusesOlderGeneration(t *testing.T) {
	o := opts(1, 1, 4, connector.BlockMajor)
	o.gen = 3
	p, _ := pair(t, o, o)
	w := p.workers[0]
	save := func(gen uint64, id uint64) *connector.Metadata {
		return &connector.Metadata{Step: 100, Generation: gen, Saves: []connector.Transfer{{ID: id, Req: "z", Blocks: []connector.BlockID{1}}}}
	}
	check := func(m *connector.Metadata, seen uint64) {
		t.Helper()
		err := w.Start(context.Background(), m)
		if !errors.Is(err, connector.ErrBadMetadata) || !errors.Is(err, connector.ErrGeneration) {
			t.Fatalf("Start(generation %d) after generation %d = %v, want an error wrapping ErrBadMetadata and ErrGeneration", m.Generation, seen, err)
		}
		for _, want := range []string{"generation " + strconv.FormatUint(m.Generation, 10), "generation " + strconv.FormatUint(seen, 10)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Start error %q does not name %q", err, want)
			}
		}
		id := m.Saves[0].ID
		if _, ok := w.offers[id]; ok {
			t.Errorf("the refused Metadata's offer %d was armed", id)
		}
		if v := w.slot(int(id % uint64(w.opt.slots))).Load(); v != 0 {
			t.Errorf("slot of the refused offer %d holds %#x, want 0", id, v)
		}
	}
	check(save(2, 901), 3) // older than the identity's generation
	if err := p.sched.Rotate(7); err != nil {
		t.Fatal(err)
	}
	p.step(nil) // the worker sees generation 7
	check(save(6, 902), 7)
	check(save(0, 903), 7)
	if err := w.Start(context.Background(), &connector.Metadata{Step: 101, Generation: 7}); err != nil {
		t.Errorf("Start(generation 7) after generation 7 = %v", err)
	}
	if err := w.Start(context.Background(), &connector.Metadata{Step: 102, Generation: 9}); err != nil {
		t.Errorf("Start(generation 9) after generation 7 = %v", err)
	}
	check(save(8, 904), 9)
}
