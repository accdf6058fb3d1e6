package prom_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvconnect/kvconnect/connector/prom"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// TestConcurrentScrapes runs calls through an instrumented store, and
// Refresh of a scheduler collector, while scrapes gather them (go test
// -race checks the sharing), and checks the counts once all is done.
func TestConcurrentScrapes(t *testing.T) {
	mem := newMemstore(t, memstore.Config{Capacity: 8 << 20})
	s := prom.InstrumentStore(mem, prom.Options{})
	sched := &fakeScheduler{}
	sc := prom.NewScheduler(sched, prom.Options{})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s, prom.NewStoreStats(mem, prom.Options{}), sc)

	const goroutines, rounds, batch = 4, 50, 8
	var wg sync.WaitGroup
	done := make(chan struct{})
	scraped := make(chan error, 1)
	go func() {
		defer close(scraped)
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := reg.Gather(); err != nil {
				scraped <- err
				return
			}
		}
	}()
	for g := range goroutines {
		src := regions(t, batch, 256)
		dst := regions(t, batch, 256)
		wg.Go(func() {
			ctx := context.Background()
			res := make([]store.Result, batch)
			keys := make([]string, batch)
			for r := range rounds {
				for i := range keys {
					keys[i] = fmt.Sprintf("t@g%d@r%d@%d", g, r, i)
				}
				if err := s.Put(ctx, keys, src, res); err != nil {
					t.Error(err)
					return
				}
				if err := s.Get(ctx, keys, dst, res); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() { // the scheduling goroutine
		for range rounds {
			sc.Refresh()
		}
	})
	wg.Wait()
	close(done)
	if err := <-scraped; err != nil {
		t.Fatalf("Gather() = %v", err)
	}
	const want = `
# HELP kvconnect_store_operation_bytes_total Value bytes of the keys that succeeded, by operation: put (the bytes offered, present keys included), get (the bytes read).
# TYPE kvconnect_store_operation_bytes_total counter
kvconnect_store_operation_bytes_total{operation="get"} 409600
kvconnect_store_operation_bytes_total{operation="put"} 409600
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvconnect_store_operation_bytes_total"); err != nil {
		t.Error(err)
	}
	if got := sched.calls; got != rounds {
		t.Errorf("the scheduler half's Stats was called %d times, want %d (by Refresh only)", got, rounds)
	}
}
