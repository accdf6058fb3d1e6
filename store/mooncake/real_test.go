//go:build linux

package mooncake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// removalTally counts what readers saw while a remover took keys away.
type removalTally struct {
	hits, torn, absent, otherErr    atomic.Int64
	removed, refused, prefixRemoved atomic.Int64
	prefixCalls                     atomic.Int64
}

func (c *removalTally) String() string {
	return fmt.Sprintf("%d values read, %d not their key's bytes, %d absent, %d other errors; removes: %d done, %d refused for a lease; %d prefix removals took %d keys",
		c.hits.Load(), c.torn.Load(), c.absent.Load(), c.otherErr.Load(), c.removed.Load(), c.refused.Load(), c.prefixCalls.Load(), c.prefixRemoved.Load())
}

// TestRealRemovalNeverTearsReads measures, against a real Mooncake
// cluster (see TestConformanceReal), what readers of 64 keys see while one
// remover removes them and a writer puts them back: first with the
// binding's removals (no force), where no read may return bytes that are
// not its key's value, then, as the baseline the binding's design answers,
// with forced removals made by calling the library directly, where such
// reads are counted and logged, not failed.
func TestRealRemovalNeverTearsReads(t *testing.T) {
	cfg := realConfig(t)
	cfg.RemoveLeaseWait = NoRemoveWait
	const keys, size, readers, reads = 64, 64 << 10, 3, 6000
	for _, forced := range []bool{false, true} {
		t.Run(fmt.Sprintf("force=%v", forced), func(t *testing.T) {
			s, err := Open(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Error(err)
				}
			})
			ctx := context.Background()
			names := make([]string, keys)
			for i := range names {
				names[i] = fmt.Sprintf("rmreal-%v/g%d/%02d", forced, i%8, i)
			}
			patterns := make([]uintptr, 8) // for forced prefix removals
			for g := range patterns {
				patterns[g] = cString(t, prefixPattern(fmt.Sprintf("rmreal-%v/g%d/", forced, g)))
			}
			vals := make([][]byte, keys)
			for i, k := range names {
				vals[i] = make([]byte, size)
				fill(vals[i], k)
			}
			src := registered(t, s, keys*size)
			for i := range names {
				copy(src.Bytes()[i*size:], vals[i])
			}
			srcRegs := slots(t, src, keys, size)
			res := make([]store.Result, keys)
			if err := s.Put(ctx, names, srcRegs, res); err != nil {
				t.Fatal(err)
			}
			cKeys := alloc(t, keys*64) // C strings of the keys, for forced removals
			for i, k := range names {
				copy(cKeys.Bytes()[i*64:], k+"\x00")
			}
			var tally removalTally
			var done atomic.Bool
			var wg sync.WaitGroup
			for r := range readers {
				dst := registered(t, s, size)
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(7, uint64(r)))
					res := make([]store.Result, 1)
					for range reads {
						i := rng.IntN(keys)
						if err := s.Get(ctx, names[i:i+1], []rdma.Region{dst.Region()}, res); err != nil {
							t.Error(err)
							return
						}
						switch {
						case res[0].Err == nil:
							tally.hits.Add(1)
							if !bytes.Equal(dst.Bytes()[:res[0].N], vals[i]) {
								tally.torn.Add(1)
							}
						case errors.Is(res[0].Err, store.ErrNotFound):
							tally.absent.Add(1)
						default:
							tally.otherErr.Add(1)
						}
					}
				})
			}
			var bg sync.WaitGroup
			bg.Go(func() { // the writer: puts back what is gone
				res := make([]store.Result, keys)
				for !done.Load() {
					if err := s.Put(ctx, names, srcRegs, res); err != nil {
						t.Error(err)
						return
					}
				}
			})
			bg.Go(func() { // the remover
				rng := rand.New(rand.NewPCG(8, 0))
				for !done.Load() {
					i := rng.IntN(keys)
					if g := rng.IntN(8); rng.IntN(32) == 0 {
						tally.prefixCalls.Add(1)
						var n int
						var err error
						if forced {
							n = int(s.lib.removeByRegex(s.handle, patterns[g], 1))
						} else if n, err = s.RemovePrefix(ctx, fmt.Sprintf("rmreal-%v/g%d/", forced, g)); err != nil {
							t.Error(err)
						}
						tally.prefixRemoved.Add(int64(max(n, 0)))
						continue
					}
					if forced {
						switch rc := s.lib.remove(s.handle, cKeys.Region().Addr+uintptr(i*64), 1); rc {
						case 0:
							tally.removed.Add(1)
						case CodeObjectHasLease:
							tally.refused.Add(1)
						}
						continue
					}
					switch err := s.Remove(ctx, names[i]); {
					case err == nil:
						tally.removed.Add(1)
					case errors.Is(err, store.ErrHasLease):
						tally.refused.Add(1)
					case !errors.Is(err, store.ErrNotFound):
						t.Error(err)
					}
				}
			})
			wg.Wait()
			done.Store(true)
			bg.Wait()
			t.Logf("force=%v: %s", forced, &tally)
			if !forced && tally.torn.Load() > 0 {
				t.Errorf("with the binding's removals, %d of %d reads returned bytes that are not their key's value", tally.torn.Load(), tally.hits.Load())
			}
		})
	}
}

// cString returns the address of a NUL-terminated copy of s in memory
// outside the Go heap, freed at the end of the test.
func cString(t testing.TB, s string) uintptr {
	m := alloc(t, len(s)+1)
	copy(m.Bytes(), s+"\x00")
	return m.Region().Addr
}
