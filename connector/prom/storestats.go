package prom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvconnect/kvconnect/store"
)

// StoreStats is a [prometheus.Collector] of a store's own counters, its
// [store.Stats]: what it holds and may hold, and what it counted of the
// calls of every caller it has (a shared store counts the calls of every
// engine). A scrape reads Stats then; a store is safe for concurrent use.
// Fields the store does not track read zero; the capacity of a store
// that does not know it (Capacity 0) is not exported.
//
// A StoreStats is safe for concurrent use.
type StoreStats struct {
	s store.Store

	keys, bytes, capacity       *prometheus.Desc
	gets, exists, puts, evicted *prometheus.Desc
	copied                      *prometheus.Desc
}

var _ prometheus.Collector = (*StoreStats)(nil)

// NewStoreStats returns a collector of s's Stats whose metrics carry the
// labels of opts. It panics if opts.Labels names a label the package sets
// (see [Options]).
func NewStoreStats(s store.Store, opts Options) *StoreStats {
	labels := opts.labels(nil)
	d := func(name, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc(namespace+"_store_"+name, help, variable, labels)
	}
	return &StoreStats{
		s:        s,
		keys:     d("stored_keys", "Keys the store holds (Stats.Keys)."),
		bytes:    d("stored_bytes", "Value bytes the store holds (Stats.Bytes)."),
		capacity: d("capacity_bytes", "Value bytes the store may hold (Stats.Capacity); absent when the store does not know."),
		gets:     d("get_keys_total", "Keys asked of Get, by result: hit (Stats.Hits), miss (Stats.Misses).", "result"),
		exists:   d("exists_keys_total", "Keys probed by Exists (Stats.Exists)."),
		puts:     d("put_keys_total", "Keys offered to Put, by result: stored (Stats.Puts), duplicate (present already, Stats.Duplicates), rejected (no space, Stats.RejectedPuts).", "result"),
		evicted:  d("evictions_total", "Keys evicted to make room (Stats.Evictions)."),
		copied:   d("copied_bytes_total", "Value bytes copied, by direction: in by Put (Stats.BytesIn), out by Get (Stats.BytesOut).", "direction"),
	}
}

// Describe implements [prometheus.Collector].
func (c *StoreStats) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.keys, c.bytes, c.capacity, c.gets, c.exists, c.puts, c.evicted, c.copied} {
		ch <- d
	}
}

// Collect implements [prometheus.Collector].
func (c *StoreStats) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	gauge := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.keys, st.Keys)
	gauge(c.bytes, st.Bytes)
	if st.Capacity > 0 {
		gauge(c.capacity, st.Capacity)
	}
	counter(c.gets, st.Hits, "hit")
	counter(c.gets, st.Misses, "miss")
	counter(c.exists, st.Exists)
	counter(c.puts, st.Puts, "stored")
	counter(c.puts, st.Duplicates, "duplicate")
	counter(c.puts, st.RejectedPuts, "rejected")
	counter(c.evicted, st.Evictions)
	counter(c.copied, st.BytesIn, "in")
	counter(c.copied, st.BytesOut, "out")
}
