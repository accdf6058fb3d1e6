package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// closeLargeKeys is the number of keys of each batch call of the
// CloseWhileLarge subtest: past the batch sizes that implementations split
// at.
const closeLargeKeys = 320

// closeLarge closes a store while workers call it with large calls:
// batches of closeLargeKeys keys and values of several MiB (as
// Options.Capacity allows). Close must return, each call must return nil
// or store.ErrClosed (ErrClosed once Close has returned), a get that
// reports a key read must have copied its value whole, and no call may
// write into its destinations once Close has returned: Close waits for
// the calls in flight. To see that, the harness overwrites the
// destinations of the gets still in flight when Close returns, and checks
// when they return that nothing wrote over it.
func (h *harness) closeLarge(t tester) {
	const workers, warmup = 3, 4
	budget := int(min(h.opts.Capacity/(2*workers), 64<<20))
	big := min(4<<20+5, budget/2)
	small := min(max(budget/2/closeLargeKeys, 1), 4096)
	type largeWorker struct {
		*worker
		smallMem, bigMem *memory
		keys             []string
		vals             [][]byte
		bigKey           string
		bigVal           []byte

		mu        sync.Mutex
		inflight  [][]byte // the destinations of the get in flight
		scribbled bool     // the harness overwrote them after Close returned
	}
	ws := make([]*largeWorker, workers)
	var mems []*memory
	for id := range ws {
		w := &largeWorker{worker: &worker{t: t, id: id, rng: rand.New(rand.NewPCG(7, uint64(id)))}}
		w.smallMem = newMemory(t, 2*closeLargeKeys, small)
		w.bigMem = newMemory(t, 2, big)
		w.keys = make([]string, closeLargeKeys)
		w.vals = make([][]byte, closeLargeKeys)
		for i := range w.keys {
			w.keys[i] = fmt.Sprintf("closelarge@%d@%03d", id, i)
			w.vals[i] = value(w.keys[i], 0, 1+(i*131)%small)
			copy(w.smallMem.bytes(i), w.vals[i])
		}
		w.bigKey = fmt.Sprintf("closelarge@%d@big", id)
		w.bigVal = value(w.bigKey, 0, big)
		copy(w.bigMem.bytes(0), w.bigVal)
		ws[id] = w
		mems = append(mems, w.smallMem, w.bigMem)
	}
	t.Logf("%d workers, each calling with batches of %d keys of up to %d bytes and values of %d bytes", workers, closeLargeKeys, small, big)
	s := h.open(t, mems...)
	var closed, stop atomic.Bool
	var started, wg sync.WaitGroup
	started.Add(workers)
	for _, w := range ws {
		w.stop = &stop
		wg.Go(func() {
			var once sync.Once
			defer once.Do(started.Done)
			n := closeLargeKeys
			src := make([]rdma.Region, n)
			dst := make([]rdma.Region, n)
			for i := range n {
				src[i] = w.smallMem.slot(i, len(w.vals[i]))
				dst[i] = w.smallMem.slot(n+i, small)
			}
			res := make([]store.Result, n)
			for i := 0; ; i++ {
				if i == warmup {
					once.Do(started.Done)
				}
				if stop.Load() {
					return
				}
				after := closed.Load() // Close had returned before this call
				op := []string{"PutBatch", "PutBig"}[min(i, 1)]
				if i >= 2 {
					op = []string{"PutBatch", "GetBatch", "ExistsBatch", "PutBig", "GetBig", "GetBatch", "GetBig"}[w.rng.IntN(7)]
				}
				var dsts [][]byte
				switch op {
				case "GetBatch":
					for j := range n {
						dsts = append(dsts, w.smallMem.bytes(n+j))
					}
				case "GetBig":
					dsts = [][]byte{w.bigMem.bytes(1)}
				}
				w.mu.Lock()
				w.inflight, w.scribbled = dsts, false
				w.mu.Unlock()
				var err error
				var keys []string
				switch op {
				case "PutBatch":
					keys = w.keys
					err = s.Put(background, keys, src, res)
				case "GetBatch":
					keys = w.keys
					err = s.Get(background, keys, dst, res)
				case "ExistsBatch":
					keys = w.keys
					err = s.Exists(background, keys, res)
				case "PutBig":
					keys = []string{w.bigKey}
					err = s.Put(background, keys, []rdma.Region{w.bigMem.slot(0, big)}, res[:1])
				case "GetBig":
					keys = []string{w.bigKey}
					err = s.Get(background, keys, []rdma.Region{w.bigMem.slot(1, big)}, res[:1])
				}
				w.mu.Lock()
				w.inflight = nil
				scribbled := w.scribbled
				w.mu.Unlock()
				call := fmt.Sprintf("%s of %d keys", op, len(keys))
				switch {
				case errors.Is(err, store.ErrClosed):
					return
				case err != nil:
					w.failf("%s = %v, want nil or store.ErrClosed", call, err)
					return
				case after:
					w.failf("%s after Close returned = nil, want store.ErrClosed", call)
					return
				}
				for j, r := range res[:len(keys)] {
					switch {
					case r.Err == nil:
					case errors.Is(r.Err, store.ErrNotFound), errors.Is(r.Err, store.ErrNoSpace),
						errors.Is(r.Err, store.ErrClosed), errors.Is(r.Err, store.ErrLeaseExpired):
						continue
					default:
						w.failf("%s while closing: key %q: %v, want nil, store.ErrNotFound, store.ErrNoSpace or store.ErrClosed", call, keys[j], r.Err)
						return
					}
					if len(dsts) == 0 {
						continue
					}
					want := w.bigVal
					if op == "GetBatch" {
						want = w.vals[j]
					}
					got := dsts[j]
					switch {
					case scribbled:
						if k := canaryBroken(got, 0); k >= 0 {
							w.failf("%s: key %q: byte %d of its destination was written after Close returned: Close must wait for the calls in flight", call, keys[j], k)
							return
						}
					case r.N != len(want) || !bytes.Equal(got[:len(want)], want):
						w.failf("%s while closing: key %q = {N: %d}, but its destination does not hold its %d-byte value%s", call, keys[j], r.N, len(want), firstDiff(want, got[:min(len(want), len(got))]))
						return
					}
				}
				if scribbled {
					for j, d := range dsts {
						if k := canaryBroken(d, 0); k >= 0 {
							w.failf("%s: key %q: byte %d of its destination was written after Close returned: Close must wait for the calls in flight", call, keys[j], k)
							return
						}
					}
				}
			}
		})
	}
	wait(t, fmt.Sprintf("the first %d calls of each worker, before Close", warmup), &started)
	var closing sync.WaitGroup
	var err error
	closing.Go(func() { err = s.Close() })
	wait(t, "Close, with large calls in flight", &closing)
	closed.Store(true)
	for _, w := range ws {
		w.mu.Lock()
		for _, d := range w.inflight {
			canary(d)
		}
		w.scribbled = w.inflight != nil
		w.mu.Unlock()
	}
	if err != nil {
		t.Errorf("Close() with large calls in flight = %v, want nil", err)
	}
	wait(t, "the workers calling with large calls while Close ran", &wg)
}
