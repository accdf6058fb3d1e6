package prom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvconnect/kvconnect/store/tiered"
)

// TierStats is a [prometheus.Collector] of the tiers of a store in tiers
// ([tiered.Store.Tiers]), each metric labelled with the tier's medium
// ("CPU", "DISK", "STORAGE"): where the hits come from, what moves
// between the tiers, and what each tier holds. A scrape reads Tiers then.
//
// A TierStats is safe for concurrent use.
type TierStats struct {
	s *tiered.Store

	gets, moved, skipped   *prometheus.Desc
	keys, bytes, evictions *prometheus.Desc
}

var _ prometheus.Collector = (*TierStats)(nil)

// NewTierStats returns a collector of the tiers of s whose metrics carry
// the labels of opts. It panics if opts.Labels names a label the package
// sets (see [Options]).
func NewTierStats(s *tiered.Store, opts Options) *TierStats {
	labels := opts.labels(nil)
	d := func(name, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc(namespace+"_store_tier_"+name, help, append([]string{"medium"}, variable...), labels)
	}
	return &TierStats{
		s:         s,
		gets:      d("get_keys_total", "Keys a Get of the store asked this tier for, by result: hit (served here), miss (not served here; a lower tier was asked).", "result"),
		moved:     d("moved_keys_total", "Keys copied into this tier, by direction: up (promoted from a tier below), down (written through, written back or copied down from a tier above).", "direction"),
		skipped:   d("skipped_keys_total", "Keys not copied into this tier, by reason: filtered (the admission filter), dropped (write-back queue full, value too large), failed (the tier's put failed).", "reason"),
		keys:      d("stored_keys", "Keys the tier holds (its Stats.Keys)."),
		bytes:     d("stored_bytes", "Value bytes the tier holds (its Stats.Bytes)."),
		evictions: d("evictions_total", "Keys the tier evicted to make room (its Stats.Evictions)."),
	}
}

// Describe implements [prometheus.Collector].
func (c *TierStats) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.gets, c.moved, c.skipped, c.keys, c.bytes, c.evictions} {
		ch <- d
	}
}

// Collect implements [prometheus.Collector].
func (c *TierStats) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.s.Tiers() {
		m := func(d *prometheus.Desc, kind prometheus.ValueType, v int64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, kind, float64(v), append([]string{t.Medium}, labels...)...)
		}
		m(c.gets, prometheus.CounterValue, t.Hits, "hit")
		m(c.gets, prometheus.CounterValue, t.Misses, "miss")
		m(c.moved, prometheus.CounterValue, t.Promotions, "up")
		m(c.moved, prometheus.CounterValue, t.Demotions, "down")
		m(c.skipped, prometheus.CounterValue, t.Filtered, "filtered")
		m(c.skipped, prometheus.CounterValue, t.Dropped, "dropped")
		m(c.skipped, prometheus.CounterValue, t.Errors, "failed")
		m(c.keys, prometheus.GaugeValue, t.Store.Keys)
		m(c.bytes, prometheus.GaugeValue, t.Store.Bytes)
		m(c.evictions, prometheus.CounterValue, t.Store.Evictions)
	}
}
