package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// faultRig is a Faulty store over a reference store, with host memory for
// n values of 64 bytes.
type faultRig struct {
	t     *testing.T
	inner *refStore
	f     Faulty
	mem   *memory
}

func newFaultRig(t *testing.T, n int, opts FaultOptions) *faultRig {
	inner := newRefStore(noBug, 0)
	r := &faultRig{t: t, inner: inner, f: NewFaulty(inner, opts), mem: newMemory(t, n, 64)}
	t.Cleanup(func() {
		if err := r.f.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

func faultKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("f@%04d", i)
	}
	return keys
}

// put stores keys (one value each, 64 bytes) through s and returns the results.
func (r *faultRig) put(s store.Store, keys []string) ([]store.Result, error) {
	src := make([]rdma.Region, len(keys))
	for i, k := range keys {
		fillValue(r.mem.bytes(i), k, 1)
		src[i] = r.mem.slot(i, 64)
	}
	res := make([]store.Result, len(keys))
	err := s.Put(background, keys, src, res)
	return res, err
}

func (r *faultRig) get(s store.Store, keys []string) ([]store.Result, error) {
	dst := make([]rdma.Region, len(keys))
	for i := range keys {
		canary(r.mem.bytes(i))
		dst[i] = r.mem.slot(i, 64)
	}
	res := make([]store.Result, len(keys))
	err := s.Get(background, keys, dst, res)
	return res, err
}

func (r *faultRig) exists(s store.Store, keys []string) []store.Result {
	res := make([]store.Result, len(keys))
	if err := s.Exists(background, keys, res); err != nil {
		r.t.Fatalf("Exists = %v", err)
	}
	return res
}

// outcome renders results for comparison: "ok N" or the error text.
func outcome(res []store.Result) []string {
	out := make([]string, len(res))
	for i, r := range res {
		out[i] = fmt.Sprintf("ok %d", r.N)
		if r.Err != nil {
			out[i] = r.Err.Error()
		}
	}
	return out
}

func TestFaultyDeterministic(t *testing.T) {
	opts := FaultOptions{Seed: 7, CallRate: 0.1, KeyRate: 0.2, VanishRate: 0.2}
	keys := faultKeys(64)
	script := func(seed uint64) []string {
		opts := opts
		opts.Seed = seed
		r := newFaultRig(t, len(keys), opts)
		var log []string
		for round := range 6 {
			batch := keys[round*8 : round*8+24]
			res, err := r.put(r.f, batch)
			log = append(log, fmt.Sprint("put ", err, outcome(res)))
			log = append(log, fmt.Sprint("exists ", outcome(r.exists(r.f, batch))))
			res, err = r.get(r.f, batch)
			log = append(log, fmt.Sprint("get ", err, outcome(res)))
		}
		return append(log, fmt.Sprintf("%+v", r.f.Faults()))
	}
	a, b := script(7), script(7)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("two runs with seed 7 differ (-first +second):\n%s", diff)
	}
	if c := script(8); slices.Equal(a, c) {
		t.Errorf("runs with seeds 7 and 8 injected the same faults:\n%v", a)
	}
}

// TestFaultyInterleaving checks that per-key faults do not depend on how
// goroutines working on different keys interleave.
func TestFaultyInterleaving(t *testing.T) {
	opts := FaultOptions{Seed: 3, KeyRate: 0.3}
	const workers, per = 4, 16
	keys := faultKeys(workers * per)
	run := func(concurrent bool) [][]string {
		r := newFaultRig(t, len(keys), opts)
		out := make([][]string, workers)
		var wg sync.WaitGroup
		for w := range workers {
			body := func() {
				mine := keys[w*per : (w+1)*per]
				src := make([]rdma.Region, per)
				for i := range mine {
					src[i] = r.mem.slot(w*per+i, 64)
				}
				for range 5 {
					res := make([]store.Result, per)
					if err := r.f.Put(background, mine, src, res); err != nil {
						t.Errorf("Put = %v", err)
						return
					}
					out[w] = append(out[w], outcome(res)...)
				}
			}
			if concurrent {
				wg.Go(body)
			} else {
				body()
			}
		}
		wg.Wait()
		return out
	}
	if diff := cmp.Diff(run(false), run(true)); diff != "" {
		t.Errorf("faults differ between a sequential and a concurrent run (-sequential +concurrent):\n%s", diff)
	}
}

func TestFaultyRates(t *testing.T) {
	const n = 4000
	keys := faultKeys(n)
	r := newFaultRig(t, n, FaultOptions{Seed: 11, KeyRate: 0.25, Ops: OpPut})
	res, err := r.put(r.f, keys)
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	kinds := map[error]int{}
	for i, x := range res {
		if x.Err == nil {
			continue
		}
		failed++
		if !errors.Is(x.Err, ErrInjected) {
			t.Fatalf("key %q: %v, not an injected error", keys[i], x.Err)
		}
		for _, e := range []error{store.ErrNoSpace, store.ErrTransfer} {
			if errors.Is(x.Err, e) {
				kinds[e]++
			}
		}
	}
	if failed < n/5 || failed > 3*n/10 {
		t.Errorf("KeyRate 0.25 failed %d of %d keys, want about %d", failed, n, n/4)
	}
	if kinds[store.ErrNoSpace] == 0 || kinds[store.ErrTransfer] == 0 || kinds[store.ErrNoSpace]+kinds[store.ErrTransfer] != failed {
		t.Errorf("injected put errors = %v, want both defaults and nothing else", kinds)
	}
	if got := r.f.Faults(); got.Keys != int64(failed) || got.Calls != 0 {
		t.Errorf("Faults() = %+v, want Keys %d and no Calls", got, failed)
	}
	// Faulted keys were not stored; the others were.
	inner := r.exists(r.inner, keys)
	for i := range keys {
		if stored := inner[i].Err == nil; stored != (res[i].Err == nil) {
			t.Fatalf("key %q: Put result %v, but stored in the wrapped store = %v", keys[i], res[i].Err, stored)
		}
	}
}

func TestFaultyGetScribbles(t *testing.T) {
	keys := faultKeys(200)
	r := newFaultRig(t, len(keys), FaultOptions{Seed: 5, KeyRate: 0.5, Ops: OpGet, Scribble: true, GetErrors: []error{store.ErrTransfer}})
	if res, err := r.put(r.f, keys); err != nil || slices.ContainsFunc(res, func(x store.Result) bool { return x.Err != nil }) {
		t.Fatalf("Put with only get faults = %v, %v", err, outcome(res))
	}
	res, err := r.get(r.f, keys)
	if err != nil {
		t.Fatal(err)
	}
	var ok, bad int
	for i, x := range res {
		b := r.mem.bytes(i)
		switch {
		case x.Err == nil:
			ok++
			if !slices.Equal(b, value(keys[i], 1, 64)) {
				t.Errorf("Get(%q) succeeded with the wrong bytes", keys[i])
			}
		case errors.Is(x.Err, ErrInjected) && errors.Is(x.Err, store.ErrTransfer):
			bad++
			if canaryBroken(b, 0) < 0 {
				t.Errorf("Get(%q) failed by injection with Scribble set, but its destination is untouched", keys[i])
			}
		default:
			t.Errorf("Get(%q): %v, want nil or an injected store.ErrTransfer", keys[i], x.Err)
		}
	}
	if ok == 0 || bad == 0 {
		t.Errorf("KeyRate 0.5 on 200 gets: %d succeeded, %d failed; want both", ok, bad)
	}
}

func TestFaultyVanish(t *testing.T) {
	keys := faultKeys(10)
	r := newFaultRig(t, len(keys), FaultOptions{Seed: 1, VanishRate: 1})
	if _, err := r.put(r.f, keys); err != nil {
		t.Fatal(err)
	}
	for i, x := range r.exists(r.f, keys) {
		if x.Err != nil {
			t.Errorf("Exists(%q) = %v, want present", keys[i], x.Err)
		}
	}
	res, err := r.get(r.f, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range res {
		if !errors.Is(x.Err, store.ErrNotFound) {
			t.Errorf("Get(%q) after Exists with VanishRate 1 = %v, want store.ErrNotFound", keys[i], x.Err)
		}
	}
	if got := r.f.Faults().Vanished; got != int64(len(keys)) {
		t.Errorf("Faults().Vanished = %d, want %d", got, len(keys))
	}
}

func TestFaultyWholeCalls(t *testing.T) {
	keys := faultKeys(4)
	r := newFaultRig(t, len(keys), FaultOptions{Seed: 2, CallRate: 1})
	_, err := r.put(r.f, keys)
	if !errors.Is(err, ErrInjected) || !errors.Is(err, store.ErrTransfer) {
		t.Errorf("Put with CallRate 1 = %v, want an injected store.ErrTransfer", err)
	}
	for i, x := range r.exists(r.inner, keys) {
		if !errors.Is(x.Err, store.ErrNotFound) {
			t.Errorf("key %q: stored by a Put that failed as a whole", keys[i])
		}
	}
	if _, err := r.get(r.f, keys); !errors.Is(err, ErrInjected) {
		t.Errorf("Get with CallRate 1 = %v, want an injected error", err)
	}
	if err := r.f.Remove(background, keys[0]); !errors.Is(err, ErrInjected) {
		t.Errorf("Remove with CallRate 1 = %v, want an injected error", err)
	}
	if _, err := r.f.RemoveAll(background); !errors.Is(err, ErrInjected) {
		t.Errorf("RemoveAll with CallRate 1 = %v, want an injected error", err)
	}
	if got := r.f.Faults().Calls; got != 4 {
		t.Errorf("Faults().Calls = %d, want 4", got)
	}
}

func TestFaultyLeavesBadInputAlone(t *testing.T) {
	r := newFaultRig(t, 2, FaultOptions{Seed: 1, KeyRate: 1})
	res, err := r.put(r.f, []string{"has space", "f@ok"})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res[0].Err, store.ErrInvalidKey) || errors.Is(res[0].Err, ErrInjected) {
		t.Errorf("Put of an invalid key under KeyRate 1 = %v, want the store's store.ErrInvalidKey", res[0].Err)
	}
	if !errors.Is(res[1].Err, ErrInjected) {
		t.Errorf("Put of a valid key under KeyRate 1 = %v, want an injected error", res[1].Err)
	}
	if err := r.f.Exists(background, []string{"a", "b"}, make([]store.Result, 1)); err == nil || errors.Is(err, ErrInjected) {
		t.Errorf("Exists with mismatched slices = %v, want the whole-call error of the batch check", err)
	}
}

func TestFaultyLatencyHonorsContext(t *testing.T) {
	r := newFaultRig(t, 1, FaultOptions{Latency: 1 << 62})
	ctx, cancel := context.WithCancel(background)
	cancel()
	if err := r.f.Exists(ctx, []string{"f@0"}, make([]store.Result, 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("Exists with a canceled context during latency = %v, want context.Canceled", err)
	}
}

// TestFaultyBandwidth checks that calls share one link: two gets of 8
// values of 64 bytes each, at 64 KiB/s, running together, cannot both end
// before 2×512 bytes have crossed it (a lower bound only, which no load on
// the machine can make fail), and that a context done while queued ends
// the call.
func TestFaultyBandwidth(t *testing.T) {
	const bw = 64 << 10
	r := newFaultRig(t, 16, FaultOptions{Bandwidth: bw})
	keys := faultKeys(16)
	if _, err := r.put(r.inner, keys); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for half := range 2 {
		wg.Go(func() {
			ks := keys[half*8 : (half+1)*8]
			dst := make([]rdma.Region, len(ks))
			for i := range ks {
				dst[i] = r.mem.slot(half*8+i, 64)
			}
			res := make([]store.Result, len(ks))
			if err := r.f.Get(background, ks, dst, res); err != nil {
				t.Errorf("Get = %v", err)
			}
		})
	}
	wg.Wait()
	if took, least := time.Since(start), time.Duration(float64(2*8*64)/bw*float64(time.Second)); took < least {
		t.Errorf("two gets of 512 bytes at %d B/s took %v, want at least %v: they did not queue on one link", bw, took, least)
	}
	slow := NewFaulty(r.inner, FaultOptions{Bandwidth: 1})
	ctx, cancel := context.WithCancel(background)
	cancel()
	if err := slow.Get(ctx, keys[:1], []rdma.Region{r.mem.slot(0, 64)}, make([]store.Result, 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("Get at 1 B/s with a canceled context = %v, want context.Canceled", err)
	}
}

func TestNewFaultyRejectsBadOptions(t *testing.T) {
	for _, opts := range []FaultOptions{{CallRate: -0.1}, {KeyRate: 1.5}, {VanishRate: 2}, {Latency: -1}, {Bandwidth: -1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewFaulty(%+v) did not panic", opts)
				}
			}()
			NewFaulty(newRefStore(noBug, 0), opts)
		}()
	}
}

// TestFaultyConcurrent hammers a Faulty store from several goroutines, for
// the race detector.
func TestFaultyConcurrent(t *testing.T) {
	keys := faultKeys(32)
	r := newFaultRig(t, 4*len(keys), FaultOptions{Seed: 9, CallRate: 0.05, KeyRate: 0.1, VanishRate: 0.1, Scribble: true})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			src := make([]rdma.Region, len(keys))
			for i := range keys {
				src[i] = r.mem.slot(w*len(keys)+i, 64)
			}
			res := make([]store.Result, len(keys))
			for range 50 {
				if err := r.f.Put(background, keys, src, res); err != nil && !errors.Is(err, ErrInjected) {
					t.Errorf("Put = %v", err)
				}
				if err := r.f.Exists(background, keys, res); err != nil && !errors.Is(err, ErrInjected) {
					t.Errorf("Exists = %v", err)
				}
				if err := r.f.Get(background, keys, src, res); err != nil && !errors.Is(err, ErrInjected) {
					t.Errorf("Get = %v", err)
				}
			}
		})
	}
	wg.Wait()
	if got := r.f.Faults(); got.Calls == 0 || got.Keys == 0 || got.Vanished == 0 {
		t.Errorf("Faults() = %+v, want some of every kind", got)
	}
}

// A Faulty store implements store.Vectored exactly when the store it wraps
// does, and PutV and GetV get the faults of Put and Get: the same keys
// fail, faulted keys are not stored or read, and Scribble writes over
// every region of a faulted GetV key.
func TestFaultyVectored(t *testing.T) {
	if _, ok := NewFaulty(newRefStore(noBug, 0), FaultOptions{}).(store.Vectored); ok {
		t.Error("NewFaulty over a store without store.Vectored implements it")
	}
	opts := FaultOptions{Seed: 9, KeyRate: 0.4, Scribble: true, GetErrors: []error{store.ErrTransfer}}
	keys := faultKeys(64)
	mem := newMemory(t, len(keys), 64)
	lists := make([][]rdma.Region, len(keys)) // each value in two regions
	plain := make([]rdma.Region, len(keys))
	for i, k := range keys {
		fillValue(mem.bytes(i), k, 1)
		lists[i] = []rdma.Region{mem.subslot(i, 0, 24), mem.subslot(i, 24, 40)}
		plain[i] = mem.slot(i, 64)
	}
	run := func(vectored bool) (put, get []string) {
		inner := newVecStore(noVBug)
		f := NewFaulty(inner, opts)
		v, ok := f.(store.Vectored)
		if !ok {
			t.Fatal("NewFaulty over a store with store.Vectored does not implement it")
		}
		res := make([]store.Result, len(keys))
		var err error
		if vectored {
			err = v.PutV(background, keys, lists, res)
		} else {
			err = f.Put(background, keys, plain, res)
		}
		if err != nil {
			t.Fatal(err)
		}
		put = outcome(res)
		stored := holds(t, inner, keys)
		for i, x := range res {
			if (x.Err == nil) != stored[i] {
				t.Fatalf("vectored %v: key %q: put %v, but stored in the wrapped store = %v", vectored, keys[i], x.Err, stored[i])
			}
		}
		if vectored {
			err = v.GetV(background, keys, lists, res)
		} else {
			err = f.Get(background, keys, plain, res)
		}
		if err != nil {
			t.Fatal(err)
		}
		get = outcome(res)
		for i, x := range res {
			want := value(keys[i], 1, 64)
			switch {
			case x.Err == nil && stored[i] && !bytes.Equal(mem.bytes(i), want):
				t.Errorf("vectored %v: key %q read, but its regions do not hold its value", vectored, keys[i])
			case x.Err != nil && errors.Is(x.Err, ErrInjected) && (bytes.Equal(mem.bytes(i)[:24], want[:24]) || bytes.Equal(mem.bytes(i)[24:], want[24:])):
				t.Errorf("vectored %v: key %q faulted with Scribble, but a region of it was not scribbled on", vectored, keys[i])
			}
			fillValue(mem.bytes(i), keys[i], 1)
		}
		if f.Faults().Keys == 0 {
			t.Errorf("vectored %v: no faults injected at KeyRate %v", vectored, opts.KeyRate)
		}
		return put, get
	}
	p1, g1 := run(false)
	p2, g2 := run(true)
	if diff := cmp.Diff(p1, p2); diff != "" {
		t.Errorf("PutV faults differ from Put's (-Put +PutV):\n%s", diff)
	}
	if diff := cmp.Diff(g1, g2); diff != "" {
		t.Errorf("GetV faults differ from Get's (-Get +GetV):\n%s", diff)
	}
}

// holds reports, for each key, whether s holds it.
func holds(t *testing.T, s store.Store, keys []string) []bool {
	res := make([]store.Result, len(keys))
	if err := s.Exists(background, keys, res); err != nil {
		t.Fatal(err)
	}
	out := make([]bool, len(keys))
	for i, x := range res {
		out[i] = x.Err == nil
	}
	return out
}

// vecLeaser is a vecStore that implements store.Leaser, declaring l.
type vecLeaser struct {
	*vecStore
	l store.Leases
}

func (s vecLeaser) Leases() store.Leases { return s.l }

// A Faulty store implements store.Leaser exactly when the store it wraps
// does, with or without store.Vectored, and reports the wrapped store's
// Leases.
func TestFaultyLeaser(t *testing.T) {
	l := store.Leases{Exists: true, Get: true, TTL: 3 * time.Second, RemoveWait: time.Second}
	for _, tc := range []struct {
		name             string
		inner            store.Store
		vectored, leaser bool
	}{
		{"Plain", newRefStore(noBug, 0), false, false},
		{"Vectored", newVecStore(noVBug), true, false},
		{"Leaser", newLeasingStore(l), false, true},
		{"VectoredLeaser", vecLeaser{newVecStore(noVBug), l}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFaulty(tc.inner, FaultOptions{Seed: 1})
			if _, ok := f.(store.Vectored); ok != tc.vectored {
				t.Errorf("NewFaulty(%T) implements store.Vectored: %v, want %v", tc.inner, ok, tc.vectored)
			}
			got, ok := f.(store.Leaser)
			if ok != tc.leaser {
				t.Fatalf("NewFaulty(%T) implements store.Leaser: %v, want %v", tc.inner, ok, tc.leaser)
			}
			if ok && got.Leases() != l {
				t.Errorf("NewFaulty(%T).Leases() = %+v, want the wrapped store's %+v", tc.inner, got.Leases(), l)
			}
			if f.Unwrap() != tc.inner {
				t.Errorf("NewFaulty(%T).Unwrap() = %T, want the wrapped store", tc.inner, f.Unwrap())
			}
		})
	}
}

// TestFillValueBytes: fillValue writes, for every length, the bytes of
// its definition: byte j of word i/8 is byte j of mix(x+i), little end
// first, the last word cut short.
func TestFillValueBytes(t *testing.T) {
	for n := range 41 {
		want := make([]byte, n)
		v := uint64(7)
		x := hashString("k") ^ (v * 0x9e3779b97f4a7c15)
		for i := 0; i < n; i += 8 {
			x = mix(x + uint64(i))
			for j := 0; j < 8 && i+j < n; j++ {
				want[i+j] = byte(x >> (8 * j))
			}
		}
		got := make([]byte, n)
		fillValue(got, "k", 7)
		if !bytes.Equal(got, want) {
			t.Fatalf("fillValue of %d bytes = %x, want %x", n, got, want)
		}
	}
}
