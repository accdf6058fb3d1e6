package prom_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvconnect/kvconnect/connector/prom"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// statsStore is a store that reports the Stats it is given.
type statsStore struct {
	store.Store
	st store.Stats
}

func (s statsStore) Stats() store.Stats { return s.st }

// TestStoreStats checks every metric of a store's collector, exactly.
func TestStoreStats(t *testing.T) {
	s := statsStore{st: store.Stats{
		Keys: 1, Bytes: 2, Capacity: 3, Hits: 4, Misses: 5, Exists: 6, Puts: 7,
		Duplicates: 8, RejectedPuts: 9, Evictions: 10, BytesIn: 11, BytesOut: 12,
	}}
	const want = `
# HELP kvconnect_store_capacity_bytes Value bytes the store may hold (Stats.Capacity); absent when the store does not know.
# TYPE kvconnect_store_capacity_bytes gauge
kvconnect_store_capacity_bytes 3
# HELP kvconnect_store_copied_bytes_total Value bytes copied, by direction: in by Put (Stats.BytesIn), out by Get (Stats.BytesOut).
# TYPE kvconnect_store_copied_bytes_total counter
kvconnect_store_copied_bytes_total{direction="in"} 11
kvconnect_store_copied_bytes_total{direction="out"} 12
# HELP kvconnect_store_evictions_total Keys evicted to make room (Stats.Evictions).
# TYPE kvconnect_store_evictions_total counter
kvconnect_store_evictions_total 10
# HELP kvconnect_store_exists_keys_total Keys probed by Exists (Stats.Exists).
# TYPE kvconnect_store_exists_keys_total counter
kvconnect_store_exists_keys_total 6
# HELP kvconnect_store_get_keys_total Keys asked of Get, by result: hit (Stats.Hits), miss (Stats.Misses).
# TYPE kvconnect_store_get_keys_total counter
kvconnect_store_get_keys_total{result="hit"} 4
kvconnect_store_get_keys_total{result="miss"} 5
# HELP kvconnect_store_put_keys_total Keys offered to Put, by result: stored (Stats.Puts), duplicate (present already, Stats.Duplicates), rejected (no space, Stats.RejectedPuts).
# TYPE kvconnect_store_put_keys_total counter
kvconnect_store_put_keys_total{result="duplicate"} 8
kvconnect_store_put_keys_total{result="rejected"} 9
kvconnect_store_put_keys_total{result="stored"} 7
# HELP kvconnect_store_stored_bytes Value bytes the store holds (Stats.Bytes).
# TYPE kvconnect_store_stored_bytes gauge
kvconnect_store_stored_bytes 2
# HELP kvconnect_store_stored_keys Keys the store holds (Stats.Keys).
# TYPE kvconnect_store_stored_keys gauge
kvconnect_store_stored_keys 1
`
	if err := testutil.CollectAndCompare(prom.NewStoreStats(s, prom.Options{}), strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	s.st.Capacity = 0
	if n := testutil.CollectAndCount(prom.NewStoreStats(s, prom.Options{}), "kvconnect_store_capacity_bytes"); n != 0 {
		t.Errorf("with Capacity 0: %d capacity series, want 0", n)
	}
}

// TestStoreStatsMemstore checks the collector over a real store: what it
// holds after a put, read at scrape time.
func TestStoreStatsMemstore(t *testing.T) {
	s, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := prom.NewStoreStats(s, prom.Options{})
	mem, err := rdma.AllocHost(3 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free()
	src := make([]rdma.Region, 3)
	for i := range src {
		src[i], _ = mem.Region().Sub(i*4096, 4096)
	}
	res := make([]store.Result, 3)
	if err := s.Put(context.Background(), []string{"t@a", "t@b", "t@c"}, src, res); err != nil {
		t.Fatal(err)
	}
	const want = `
# HELP kvconnect_store_capacity_bytes Value bytes the store may hold (Stats.Capacity); absent when the store does not know.
# TYPE kvconnect_store_capacity_bytes gauge
kvconnect_store_capacity_bytes 1.048576e+06
# HELP kvconnect_store_stored_bytes Value bytes the store holds (Stats.Bytes).
# TYPE kvconnect_store_stored_bytes gauge
kvconnect_store_stored_bytes 12288
# HELP kvconnect_store_stored_keys Keys the store holds (Stats.Keys).
# TYPE kvconnect_store_stored_keys gauge
kvconnect_store_stored_keys 3
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "kvconnect_store_capacity_bytes", "kvconnect_store_stored_bytes", "kvconnect_store_stored_keys"); err != nil {
		t.Error(err)
	}
}
