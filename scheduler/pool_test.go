package scheduler

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/hashing"
)

func testNS(t testing.TB, gen uint64) hashing.Namespace {
	t.Helper()
	id := testIdentity(4)
	id.Generation = gen
	ns, err := id.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func hashesOf(t testing.TB, tokens []hashing.Token) []hashing.BlockHash {
	t.Helper()
	h, err := hashing.HashBlocks(4, tokens)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func mustPool(t testing.TB, n int) *Pool {
	t.Helper()
	p, err := NewPool(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPoolLifecycle(t *testing.T) {
	ns := testNS(t, 0)
	hs := hashesOf(t, seq(1, 16)) // 4 blocks
	p := mustPool(t, 6)
	blocks, err := p.Allocate(nil, 4)
	if err != nil {
		t.Fatal(err)
	}
	if want := []BlockID{0, 1, 2, 3}; !slices.Equal(blocks, want) {
		t.Fatalf("Allocate = %v, want %v", blocks, want)
	}
	for i, b := range blocks {
		if ok, err := p.Commit(b, ns, hs[i]); !ok || err != nil {
			t.Fatalf("Commit(%d) = %v, %v", b, ok, err)
		}
	}
	if got := p.Lookup(ns, hs, nil); !slices.Equal(got, blocks) {
		t.Fatalf("Lookup = %v, want %v", got, blocks)
	}
	if got := p.Lookup(ns, hs[1:], nil); !slices.Equal(got, blocks[1:]) {
		t.Fatalf("Lookup from block 1 = %v", got)
	}
	// Another namespace (a new generation) never hits.
	if got := p.Lookup(testNS(t, 1), hs, nil); len(got) != 0 {
		t.Fatalf("Lookup in another namespace = %v", got)
	}
	// A second block with the same content is not indexed.
	dup, _ := p.Allocate(nil, 1)
	if ok, err := p.Commit(dup[0], ns, hs[0]); ok || err != nil {
		t.Fatalf("Commit of duplicate content = %v, %v; want false, nil", ok, err)
	}
	if err := p.Release(append(blocks, dup...)); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.Free != 2 || st.Cached != 4 || st.Used != 0 || st.Indexed != 4 {
		t.Fatalf("after release: %+v", st)
	}
	// Free blocks go first, then cached ones from the tail of the
	// released request (released last first).
	got, err := p.Allocate(nil, 4)
	if err != nil {
		t.Fatal(err)
	}
	if want := []BlockID{4, 5, 3, 2}; !slices.Equal(got, want) {
		t.Fatalf("Allocate = %v, want %v (free first, then the evicted tail)", got, want)
	}
	if hits := p.Lookup(ns, hs, nil); !slices.Equal(hits, []BlockID{0, 1}) {
		t.Fatalf("Lookup after eviction = %v, want [0 1]", hits)
	}
	// A hit takes a cached block back.
	if err := p.Ref(0); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Used != 5 || st.Cached != 1 {
		t.Fatalf("after Ref of a cached block: %+v", st)
	}
	p.InvalidateAll()
	if hits := p.Lookup(ns, hs, nil); len(hits) != 0 {
		t.Fatalf("Lookup after InvalidateAll = %v", hits)
	}
	if st := p.Stats(); st.Cached != 0 || st.Indexed != 0 || st.Free != 1 || st.Used != 5 {
		t.Fatalf("after InvalidateAll: %+v", st)
	}
	if err := p.Release(append(got, 0)); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Free != 6 {
		t.Fatalf("a block used across InvalidateAll is not freed: %+v", st)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestPoolBadInput(t *testing.T) {
	ns := testNS(t, 0)
	h := hashesOf(t, seq(1, 8))
	tests := []struct {
		name    string
		call    func(p *Pool) error
		want    error
		mention string
	}{
		{"Ref out of range", func(p *Pool) error { return p.Ref(4) }, ErrInvalidBlock, "block 4 outside [0, 4)"},
		{"Ref negative", func(p *Pool) error { return p.Ref(-1) }, ErrInvalidBlock, "block -1"},
		{"Ref free block", func(p *Pool) error { return p.Ref(3) }, ErrInvalidBlock, "Ref(3): the block is free"},
		{"Release out of range", func(p *Pool) error { return p.Release([]BlockID{0, 7}) }, ErrInvalidBlock, "block 7 outside"},
		{"Release free block", func(p *Pool) error { return p.Release([]BlockID{0, 3}) }, ErrInvalidBlock, "Release(3)"},
		{"Release twice", func(p *Pool) error { return p.Release([]BlockID{1, 1}) }, ErrInvalidBlock, "Release(1)"},
		{"Commit out of range", func(p *Pool) error { _, err := p.Commit(9, ns, h[0]); return err }, ErrInvalidBlock, "block 9"},
		{"Commit free block", func(p *Pool) error { _, err := p.Commit(3, ns, h[0]); return err }, ErrInvalidBlock, "Commit(3)"},
		{"Commit other content", func(p *Pool) error { _, err := p.Commit(0, ns, h[1]); return err }, ErrInvalidBlock, "Commit(0, " + h[1].String()},
		{"Allocate too many", func(p *Pool) error { _, err := p.Allocate(nil, 2); return err }, ErrNoBlocks, "want 2, 1 available"},
		{"Allocate negative", func(p *Pool) error { _, err := p.Allocate(nil, -1); return err }, ErrInvalidBlock, "Allocate(-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPool(t, 4)
			b, _ := p.Allocate(nil, 3) // 0, 1, 2 used; 3 free
			if _, err := p.Commit(b[0], ns, h[0]); err != nil {
				t.Fatal(err)
			}
			before := poolState(p)
			err := tt.call(p)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("got %v, want %v naming %q", err, tt.want, tt.mention)
			}
			if diff := cmp.Diff(before, poolState(p)); diff != "" {
				t.Fatalf("the rejected call changed the pool (-before +after):\n%s", diff)
			}
		})
	}
	if _, err := NewPool(0); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "pool of 0 blocks") {
		t.Errorf("NewPool(0): %v", err)
	}
}

type poolSnap struct {
	Stats PoolStats
	Refs  []int
	Free  []BlockID
}

func poolState(p *Pool) poolSnap {
	s := poolSnap{Stats: p.Stats(), Free: slices.Clone(p.free)}
	for b := range p.Len() {
		s.Refs = append(s.Refs, p.Refs(BlockID(b)))
	}
	return s
}

// TestPoolCheckFails proves Check able to fail: each corruption must be
// reported.
func TestPoolCheckFails(t *testing.T) {
	ns := testNS(t, 0)
	h := hashesOf(t, seq(1, 8))
	corrupt := map[string]func(p *Pool){
		"negative refcount":   func(p *Pool) { p.ref[0] = -1 },
		"ref on a free block": func(p *Pool) { p.ref[p.free[0]] = 1 },
		"used count":          func(p *Pool) { p.used++ },
		"free block indexed":  func(p *Pool) { p.index[p.free[0]] = true },
		"index entry lost":    func(p *Pool) { delete(p.cache, p.key[1]) },
		"free stack twice":    func(p *Pool) { p.free = append(p.free, p.free[0]); p.used-- },
		"LRU link broken":     func(p *Pool) { p.prev[p.tail] = -1 },
	}
	for name, f := range corrupt {
		t.Run(name, func(t *testing.T) {
			p := mustPool(t, 6)
			b, _ := p.Allocate(nil, 3)
			for i := range 2 {
				if _, err := p.Commit(b[i], ns, h[i]); err != nil {
					t.Fatal(err)
				}
			}
			extra, _ := p.Allocate(nil, 2) // released: two cached blocks
			for i, x := range hashesOf(t, seq(50, 8)) {
				if _, err := p.Commit(extra[i], ns, x); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Release(extra); err != nil {
				t.Fatal(err)
			}
			if err := p.Check(); err != nil {
				t.Fatalf("Check before the corruption: %v", err)
			}
			f(p)
			if err := p.Check(); err == nil {
				t.Fatal("Check did not see the corruption")
			}
		})
	}
}
