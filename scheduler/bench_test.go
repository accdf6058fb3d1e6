package scheduler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// stubConn is a connector that costs nothing: it holds nothing, so it
// never keeps blocks; lookups of "wait-" requests stay pending, others miss.
// It isolates the scheduler's own cost.
type stubConn struct {
	meta connector.Metadata
	prog connector.Progress
}

func (c *stubConn) Match(r *connector.Request, _ int) (connector.Match, error) {
	return connector.Match{Pending: strings.HasPrefix(string(r.ID), "wait-")}, nil
}
func (c *stubConn) Allocated(*connector.Request, int, ...[]connector.BlockID) error { return nil }
func (c *stubConn) Scheduled(*connector.Request, int, ...[]connector.BlockID) error { return nil }
func (c *stubConn) Plan() *connector.Metadata                                       { c.meta.Step++; return &c.meta }
func (c *stubConn) Update([]*connector.Output) (*connector.Progress, error)         { return &c.prog, nil }
func (c *stubConn) Finish(*connector.Request, ...[]connector.BlockID) (bool, error) {
	return false, nil
}
func (c *stubConn) Close() error { return nil }

// stepBench is a steady-state engine loop. Requests in slots decode; each
// ends after maxGen tokens and a new one with its slot's prompt (a
// multi-turn follow-up: its prefix is in the local cache) takes its place.
// Without a connector, MaxRunning keeps the slots beyond it waiting, in
// turn; with the stub connector, extra "wait-" requests stay pending
// forever, so that every step looks at every one of them.
type stepBench struct {
	s       *Scheduler
	ids     []connector.RequestID
	prompts [][]hashing.Token
	gen     []int
	res     []Result
	ended   []Ended
	maxGen  int
}

func newStepBench(tb testing.TB, running, waiting int, withConn, hybrid bool) *stepBench {
	const bs, prompt, maxGen = 16, 64, 128
	slots, maxRunning := running+waiting, running
	var conn connector.Planner
	if withConn {
		conn = &stubConn{}
		slots, maxRunning = running, 0
	}
	cfg := Config{
		Identity:         testIdentity(bs),
		Blocks:           slots*(prompt+maxGen)/bs + 2*slots,
		MaxBatchedTokens: running + 4*prompt,
		MaxRunning:       maxRunning,
		PrefixCaching:    true,
	}
	if hybrid {
		// Full attention, a window of two blocks, a state: the state
		// pool holds a state per chunk and per block of output.
		cfg.Identity = hybridIdentity(bs, 2*bs)
		cfg.GroupBlocks = []int{cfg.Blocks, cfg.Blocks, slots * (3 + maxGen/bs)}
		cfg.Blocks = 0
	}
	s, err := New(cfg, conn)
	if err != nil {
		tb.Fatal(err)
	}
	sb := &stepBench{s: s, maxGen: maxGen}
	for i := range slots {
		sb.ids = append(sb.ids, connector.RequestID(fmt.Sprintf("run-%d", i)))
		sb.prompts = append(sb.prompts, seq(i*1000, prompt))
		sb.gen = append(sb.gen, i*maxGen/slots) // staggered ends
		if err := s.Add(Request{ID: sb.ids[i], Prompt: sb.prompts[i], MaxTokens: maxGen}); err != nil {
			tb.Fatal(err)
		}
	}
	if withConn {
		for i := range waiting {
			if err := s.Add(Request{ID: connector.RequestID(fmt.Sprintf("wait-%d", i)), Prompt: seq(500000+i*100, prompt)}); err != nil {
				tb.Fatal(err)
			}
		}
	}
	// Warm up: every slot ends and restarts at least twice, so that
	// records, chains and tables reach their steady-state sizes.
	for range 4 * maxGen * slots / running {
		sb.step(tb)
	}
	return sb
}

func (sb *stepBench) step(tb testing.TB) {
	p, err := sb.s.Step()
	if err != nil {
		tb.Fatal(err)
	}
	sb.res = sb.res[:0]
	for i := range p.Items {
		it := &p.Items[i]
		if !it.Sample {
			continue
		}
		slot := atoi(string(it.ID[4:]))
		sb.gen[slot]++
		sb.res = append(sb.res, Result{ID: it.ID, Token: hashing.Token(it.End), Finished: sb.gen[slot] >= sb.maxGen})
	}
	if err := sb.s.Done(sb.res, nil); err != nil {
		tb.Fatal(err)
	}
	for _, r := range sb.res {
		if !r.Finished {
			continue
		}
		slot := atoi(string(r.ID[4:]))
		sb.gen[slot] = 0
		if err := sb.s.Add(Request{ID: sb.ids[slot], Prompt: sb.prompts[slot], MaxTokens: sb.maxGen}); err != nil {
			tb.Fatal(err)
		}
	}
	sb.ended = sb.s.TakeEnded(sb.ended[:0])
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// baselinePerRequest times the least any scheduler does per request and
// step: find the request by ID in a map and append an item for it. Measured
// in the same run, it is the unit of the x-baseline metric.
func baselinePerRequest(ids []connector.RequestID) float64 {
	m := make(map[connector.RequestID]*int, len(ids))
	for i := range ids {
		m[ids[i]] = new(int)
	}
	items := make([]Item, 0, len(ids))
	best := time.Duration(1 << 62)
	for range 5 {
		start := time.Now()
		for range 200 {
			items = items[:0]
			for _, id := range ids {
				*m[id]++
				items = append(items, Item{ID: id})
			}
		}
		best = min(best, time.Since(start))
	}
	return float64(best.Nanoseconds()) / 200 / float64(len(ids))
}

// BenchmarkStep measures one engine step (Step and Done, planner and
// tracker) with 256 running requests and 64 waiting ones.
func BenchmarkStep(b *testing.B) {
	for _, tc := range []struct {
		name             string
		withConn, hybrid bool
	}{{"no-connector", false, false}, {"pending-lookups", true, false}, {"hybrid", true, true}} {
		b.Run(tc.name, func(b *testing.B) {
			const running, waiting = 256, 64
			sb := newStepBench(b, running, waiting, tc.withConn, tc.hybrid)
			ids := append([]connector.RequestID(nil), sb.ids...)
			for i := len(ids); i < running+waiting; i++ {
				ids = append(ids, connector.RequestID(fmt.Sprintf("wait-%d", i)))
			}
			base := baselinePerRequest(ids)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				sb.step(b)
			}
			perStep := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(perStep/1000, "us/step")
			b.ReportMetric(perStep/(running+waiting), "ns/request")
			b.ReportMetric(perStep/(running+waiting)/base, "x-baseline")
			if st := sb.s.Stats(); st.Running < running-8 || st.Waiting < waiting {
				b.Fatalf("not in steady state: %+v", st)
			}
		})
	}
}

// BenchmarkPool measures the pool per block: allocate, commit, look up,
// take a reference, release, against a plain Go map lookup of a block hash
// measured in the same run.
func BenchmarkPool(b *testing.B) {
	const n = 64
	ns := testNS(b, 0)
	hashes, err := hashing.HashBlocks(4, seq(1, 4*n))
	if err != nil {
		b.Fatal(err)
	}
	p := mustPool(b, 4*n)
	m := make(map[hashing.BlockHash]BlockID, n)
	for i, h := range hashes {
		m[h] = BlockID(i)
	}
	var sink BlockID
	start := time.Now()
	const reps = 20000
	for range reps {
		for _, h := range hashes {
			sink += m[h]
		}
	}
	base := float64(time.Since(start).Nanoseconds()) / reps / n
	blocks := make([]BlockID, 0, n)
	hits := make([]BlockID, 0, n)
	b.Run("allocate-release", func(b *testing.B) {
		for b.Loop() {
			blocks, _ = p.Allocate(blocks[:0], n)
			if err := p.Release(blocks); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/block")
	})
	b.Run("allocate-commit-release-evict", func(b *testing.B) {
		k := 0
		for b.Loop() {
			blocks, _ = p.Allocate(blocks[:0], n)
			for i, bl := range blocks {
				if _, err := p.Commit(bl, ns, hashes[(k+i)%len(hashes)]); err != nil {
					b.Fatal(err)
				}
			}
			k += n
			if err := p.Release(blocks); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/block")
	})
	b.Run("lookup-ref-release", func(b *testing.B) {
		blocks, _ = p.Allocate(blocks[:0], n)
		for i, bl := range blocks {
			if _, err := p.Commit(bl, ns, hashes[i]); err != nil {
				b.Fatal(err)
			}
		}
		if err := p.Release(blocks); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			hits = p.Lookup(ns, hashes[:n], hits[:0])
			for _, bl := range hits {
				if err := p.Ref(bl); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.Release(hits); err != nil {
				b.Fatal(err)
			}
		}
		if len(hits) != n {
			b.Fatalf("%d hits, want %d", len(hits), n)
		}
		per := float64(b.Elapsed().Nanoseconds()) / float64(b.N) / n
		b.ReportMetric(per, "ns/block")
		b.ReportMetric(per/base, "x-map-lookup")
	})
	_ = sink
}

// TestStepDoesNotAllocate checks the steady state of BenchmarkStep: no
// allocation at all per step, whatever the number of requests.
func TestStepDoesNotAllocate(t *testing.T) {
	for _, tc := range []struct{ withConn, hybrid bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		sb := newStepBench(t, 64, 16, tc.withConn, tc.hybrid)
		if n := testing.AllocsPerRun(100, func() { sb.step(t) }); n != 0 {
			t.Errorf("connector %v, hybrid %v: %v allocations per step, want 0", tc.withConn, tc.hybrid, n)
		}
		if st := sb.s.Stats(); tc.hybrid && (st.Running < 32 || st.Pool.Cached == 0) {
			t.Errorf("hybrid: not in steady state: %+v", st)
		}
	}
}
