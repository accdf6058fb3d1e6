package prom

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvconnect/kvconnect/connector"
)

// connMetrics are the descriptions of a connector half's metrics, and how
// a Stats or a Health becomes them. Which are described depends on what
// the half implements: stats with connector.StatsReporter, health with
// connector.HealthReporter.
type connMetrics struct {
	stats, health bool

	lookups, lookupKeys, hitBlocks, hitTokens *prometheus.Desc
	blocks, bytes, staged, retries            *prometheus.Desc
	stale, failedSkipped, corrupt, storeFails *prometheus.Desc
	refused                                   *prometheus.Desc
	resyncs                                   *prometheus.Desc
	slowSkipped, loadTokens                   *prometheus.Desc
	lookupSeconds, transferSeconds            *prometheus.Desc

	healthy, consecutive, failedCalls, lastFailure *prometheus.Desc
}

func newConnMetrics(labels prometheus.Labels, stats, health bool) *connMetrics {
	d := func(name, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc(namespace+"_connector_"+name, help, variable, labels)
	}
	return &connMetrics{
		stats:  stats,
		health: health,

		lookups:         d("lookups_total", "Exists probes of the store started (Stats.Lookups)."),
		lookupKeys:      d("lookup_keys_total", "Keys probed by lookups (Stats.LookupKeys)."),
		hitBlocks:       d("hit_blocks_total", "Blocks matched from the store (Stats.HitBlocks)."),
		hitTokens:       d("hit_tokens_total", "Tokens matched from the store (Stats.HitTokens)."),
		blocks:          d("blocks_total", "Blocks moved by operation (load, save) and status (ok, failed; skipped: a save the store already had) (Stats.Loads, LoadFailures, Saves, SaveFailures, SaveSkipped).", "operation", "status"),
		bytes:           d("bytes_total", "Block bytes moved, by operation (load, save) (Stats.LoadBytes, SaveBytes).", "operation"),
		staged:          d("staged_bytes_total", "Bytes copied through a staging buffer (Stats.StagedBytes)."),
		retries:         d("save_retries_total", "Blocks requeued after an out-of-space put (Stats.SaveRetries)."),
		stale:           d("stale_discarded_total", "Transfers of an old weights generation dropped (Stats.StaleDiscarded)."),
		failedSkipped:   d("failed_skipped_blocks_total", "Blocks a lookup found but did not match because their load failed lately (Stats.FailedSkipped)."),
		slowSkipped:     d("slow_skipped_blocks_total", "Blocks a lookup found but did not match because loads from the store (or from the tier holding them) ran slower than the engine's prefill (Stats.SlowSkipped)."),
		loadTokens:      d("load_tokens_total", "Tokens of the blocks loaded, by the medium of the store tier that served them: CPU, DISK, STORAGE or other; counted only over a store that says which tier served a block (Stats.LoadTokensCPU, LoadTokensDisk, LoadTokensStorage, LoadTokensOther).", "medium"),
		resyncs:         d("event_resyncs_total", "AllCleared events announced because the store's feed of key events lost events (Stats.Resyncs)."),
		corrupt:         d("corrupt_blocks_total", "Loaded blocks whose bytes failed verification; also counted in blocks_total{operation=\"load\",status=\"failed\"} (Stats.Corrupt)."),
		refused:         d("refused_params_total", "Transfer parameters refused: malformed, of another identity, forged, or unverifiable (Stats.Refused)."),
		storeFails:      d("store_failures_total", "Store calls that failed, by reason: timeout (ran past their deadline, Stats.StoreTimeouts) or error (every other failure, Stats.StoreErrors minus StoreTimeouts).", "reason"),
		lookupSeconds:   d("lookup_seconds_total", "Time spent in lookups (Stats.LookupNanos)."),
		transferSeconds: d("transfer_seconds_total", "Time spent in loads and saves (Stats.TransferNanos)."),

		healthy:     d("healthy", "1 when the latest call to the store or transport succeeded, 0 while it fails (Health.Healthy)."),
		consecutive: d("consecutive_failures", "Calls to the store or transport that failed since the last one that succeeded (Health.ConsecutiveFailures)."),
		failedCalls: d("failed_calls_total", "Calls to the store or transport that failed (Health.Failures)."),
		lastFailure: d("last_failure_timestamp_seconds", "Unix time of the latest failure (Health.LastErrorTime); absent before the first."),
	}
}

func (m *connMetrics) describe(ch chan<- *prometheus.Desc) {
	if m.stats {
		for _, d := range []*prometheus.Desc{
			m.lookups, m.lookupKeys, m.hitBlocks, m.hitTokens, m.blocks, m.bytes, m.staged, m.retries,
			m.stale, m.failedSkipped, m.corrupt, m.refused, m.storeFails, m.lookupSeconds, m.transferSeconds, m.resyncs,
			m.slowSkipped, m.loadTokens,
		} {
			ch <- d
		}
	}
	if m.health {
		for _, d := range []*prometheus.Desc{m.healthy, m.consecutive, m.failedCalls, m.lastFailure} {
			ch <- d
		}
	}
}

func (m *connMetrics) collectStats(ch chan<- prometheus.Metric, st connector.Stats) {
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(m.lookups, st.Lookups)
	counter(m.lookupKeys, st.LookupKeys)
	counter(m.hitBlocks, st.HitBlocks)
	counter(m.hitTokens, st.HitTokens)
	counter(m.blocks, st.Loads, "load", "ok")
	counter(m.blocks, st.LoadFailures, "load", "failed")
	counter(m.blocks, st.Saves, "save", "ok")
	counter(m.blocks, st.SaveFailures, "save", "failed")
	counter(m.blocks, st.SaveSkipped, "save", "skipped")
	counter(m.bytes, st.LoadBytes, "load")
	counter(m.bytes, st.SaveBytes, "save")
	counter(m.staged, st.StagedBytes)
	counter(m.retries, st.SaveRetries)
	counter(m.stale, st.StaleDiscarded)
	counter(m.failedSkipped, st.FailedSkipped)
	counter(m.slowSkipped, st.SlowSkipped)
	counter(m.loadTokens, st.LoadTokensCPU, "CPU")
	counter(m.loadTokens, st.LoadTokensDisk, "DISK")
	counter(m.loadTokens, st.LoadTokensStorage, "STORAGE")
	counter(m.loadTokens, st.LoadTokensOther, "other")
	counter(m.resyncs, st.Resyncs)
	counter(m.corrupt, st.Corrupt)
	counter(m.refused, st.Refused)
	counter(m.storeFails, st.StoreTimeouts, "timeout")
	// StoreTimeouts are part of StoreErrors; a snapshot that says
	// otherwise (torn, from a connector that reads them apart) counts no
	// other error rather than a negative one.
	counter(m.storeFails, max(0, st.StoreErrors-st.StoreTimeouts), "error")
	ch <- prometheus.MustNewConstMetric(m.lookupSeconds, prometheus.CounterValue, float64(st.LookupNanos)/1e9)
	ch <- prometheus.MustNewConstMetric(m.transferSeconds, prometheus.CounterValue, float64(st.TransferNanos)/1e9)
}

func (m *connMetrics) collectHealth(ch chan<- prometheus.Metric, h connector.Health) {
	healthy := 0.0
	if h.Healthy() {
		healthy = 1
	}
	ch <- prometheus.MustNewConstMetric(m.healthy, prometheus.GaugeValue, healthy)
	ch <- prometheus.MustNewConstMetric(m.consecutive, prometheus.GaugeValue, float64(h.ConsecutiveFailures))
	ch <- prometheus.MustNewConstMetric(m.failedCalls, prometheus.CounterValue, float64(h.Failures))
	if !h.LastErrorTime.IsZero() {
		ch <- prometheus.MustNewConstMetric(m.lastFailure, prometheus.GaugeValue, float64(h.LastErrorTime.UnixNano())/1e9)
	}
}

// Scheduler is a [prometheus.Collector] of a connector's scheduler half:
// its [connector.Stats], when it implements [connector.StatsReporter], and
// its [connector.Health], when it implements [connector.HealthReporter],
// every metric labelled role="scheduler" and rank="" (an empty label,
// which Prometheus stores as none; the workers' series have a rank). A
// half that implements neither exports nothing.
//
// A scheduler half's Stats may be called only from the engine's
// scheduling goroutine, so a scrape does not call it: the engine calls
// [Scheduler.Refresh] from that goroutine, once a step say, and a scrape
// exports the Stats of the latest Refresh (zero before the first).
// Health may be called from any goroutine, and a scrape reads it then.
//
// Refresh, Describe and Collect may be called concurrently.
type Scheduler struct {
	m  *connMetrics
	sr connector.StatsReporter // nil: no stats
	hr connector.HealthReporter
	mu struct {
		sync.Mutex
		st connector.Stats
	}
}

var _ prometheus.Collector = (*Scheduler)(nil)

// NewScheduler returns a collector of s, whose metrics carry the labels
// of opts, role="scheduler" and rank="". It panics if opts.Labels names a label
// the package sets (see [Options]).
func NewScheduler(s connector.Planner, opts Options) *Scheduler {
	c := &Scheduler{}
	c.sr, _ = s.(connector.StatsReporter)
	c.hr, _ = s.(connector.HealthReporter)
	// rank="" is no label to Prometheus, but client_golang wants every
	// series of a name to carry the same label names, and the workers'
	// carry a rank: so the two halves register together.
	c.m = newConnMetrics(opts.labels(prometheus.Labels{"role": "scheduler", "rank": ""}), c.sr != nil, c.hr != nil)
	return c
}

// Refresh takes a snapshot of the scheduler half's Stats for the next
// scrapes. Call it from the engine's scheduling goroutine, the one that
// drives the half. It does nothing for a half without Stats.
func (c *Scheduler) Refresh() {
	if c.sr == nil {
		return
	}
	st := c.sr.Stats()
	c.mu.Lock()
	c.mu.st = st
	c.mu.Unlock()
}

// Describe implements [prometheus.Collector].
func (c *Scheduler) Describe(ch chan<- *prometheus.Desc) { c.m.describe(ch) }

// Collect implements [prometheus.Collector].
func (c *Scheduler) Collect(ch chan<- prometheus.Metric) {
	if c.sr != nil {
		c.mu.Lock()
		st := c.mu.st
		c.mu.Unlock()
		c.m.collectStats(ch, st)
	}
	if c.hr != nil {
		c.m.collectHealth(ch, c.hr.Health())
	}
}

// Worker is a [prometheus.Collector] of one worker half of a connector
// (one tensor-parallel rank): its [connector.Stats], when it implements
// [connector.StatsReporter], and its [connector.Health], when it
// implements [connector.HealthReporter], every metric labelled
// role="worker" and rank="<rank>". A scrape reads both then: a worker's
// Stats and Health may be called from any goroutine. A half that
// implements neither exports nothing.
//
// An engine with several workers registers one Worker per rank, on the
// same registry: each series carries its rank, and a query sums them
// (see "Ranks" in the package doc). A Worker is safe for concurrent use.
type Worker struct {
	m  *connMetrics
	sr connector.StatsReporter
	hr connector.HealthReporter
}

var _ prometheus.Collector = (*Worker)(nil)

// NewWorker returns a collector of w, the worker half of the given
// tensor-parallel rank, whose metrics carry the labels of opts,
// role="worker" and rank. It panics if rank is negative or opts.Labels
// names a label the package sets (see [Options]).
func NewWorker(w connector.Worker, rank int, opts Options) *Worker {
	if rank < 0 {
		panic("prom: NewWorker: rank " + strconv.Itoa(rank) + " is negative")
	}
	c := &Worker{}
	c.sr, _ = w.(connector.StatsReporter)
	c.hr, _ = w.(connector.HealthReporter)
	c.m = newConnMetrics(opts.labels(prometheus.Labels{"role": "worker", "rank": strconv.Itoa(rank)}), c.sr != nil, c.hr != nil)
	return c
}

// Describe implements [prometheus.Collector].
func (c *Worker) Describe(ch chan<- *prometheus.Desc) { c.m.describe(ch) }

// Collect implements [prometheus.Collector].
func (c *Worker) Collect(ch chan<- prometheus.Metric) {
	if c.sr != nil {
		c.m.collectStats(ch, c.sr.Stats())
	}
	if c.hr != nil {
		c.m.collectHealth(ch, c.hr.Health())
	}
}
