package prom_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/prom"
)

// fakeScheduler and fakeWorker are connector halves that report the
// Stats and Health they are given; their other methods are never called.
type (
	fakeScheduler struct {
		connector.Planner
		st    connector.Stats
		h     connector.Health
		calls int // Stats calls
	}
	fakeWorker struct {
		connector.Worker
		st connector.Stats
		h  connector.Health
	}
	// bareWorker implements neither StatsReporter nor HealthReporter.
	bareWorker struct{ connector.Worker }
)

func (f *fakeScheduler) Stats() connector.Stats   { f.calls++; return f.st }
func (f *fakeScheduler) Health() connector.Health { return f.h }
func (f *fakeWorker) Stats() connector.Stats      { return f.st }
func (f *fakeWorker) Health() connector.Health    { return f.h }

// stats returns Stats whose every field differs, from base on.
func stats(base int64) connector.Stats {
	return connector.Stats{
		Lookups: base + 1, LookupKeys: base + 2, HitBlocks: base + 3, HitTokens: base + 4,
		Loads: base + 5, LoadBytes: base + 6, LoadFailures: base + 7, Saves: base + 8,
		SaveBytes: base + 9, SaveSkipped: base + 10, SaveFailures: base + 11, SaveRetries: base + 12,
		StagedBytes: base + 13, LookupNanos: 1_500_000_000, TransferNanos: 250_000_000,
		StaleDiscarded: base + 14, Corrupt: base + 15, StoreErrors: base + 20, StoreTimeouts: base + 16,
		FailedSkipped: base + 17, Refused: base + 18, Resyncs: base + 19, SlowSkipped: base + 21,
		LoadTokensCPU: base + 22, LoadTokensDisk: base + 23, LoadTokensStorage: base + 24, LoadTokensOther: base + 25,
	}
}

const workerWant = `
# HELP kvconnect_connector_blocks_total Blocks moved by operation (load, save) and status (ok, failed; skipped: a save the store already had) (Stats.Loads, LoadFailures, Saves, SaveFailures, SaveSkipped).
# TYPE kvconnect_connector_blocks_total counter
kvconnect_connector_blocks_total{engine="e1",operation="load",rank="3",role="worker",status="failed"} 7
kvconnect_connector_blocks_total{engine="e1",operation="load",rank="3",role="worker",status="ok"} 5
kvconnect_connector_blocks_total{engine="e1",operation="save",rank="3",role="worker",status="failed"} 11
kvconnect_connector_blocks_total{engine="e1",operation="save",rank="3",role="worker",status="ok"} 8
kvconnect_connector_blocks_total{engine="e1",operation="save",rank="3",role="worker",status="skipped"} 10
# HELP kvconnect_connector_bytes_total Block bytes moved, by operation (load, save) (Stats.LoadBytes, SaveBytes).
# TYPE kvconnect_connector_bytes_total counter
kvconnect_connector_bytes_total{engine="e1",operation="load",rank="3",role="worker"} 6
kvconnect_connector_bytes_total{engine="e1",operation="save",rank="3",role="worker"} 9
# HELP kvconnect_connector_consecutive_failures Calls to the store or transport that failed since the last one that succeeded (Health.ConsecutiveFailures).
# TYPE kvconnect_connector_consecutive_failures gauge
kvconnect_connector_consecutive_failures{engine="e1",rank="3",role="worker"} 2
# HELP kvconnect_connector_corrupt_blocks_total Loaded blocks whose bytes failed verification; also counted in blocks_total{operation="load",status="failed"} (Stats.Corrupt).
# TYPE kvconnect_connector_corrupt_blocks_total counter
kvconnect_connector_corrupt_blocks_total{engine="e1",rank="3",role="worker"} 15
# HELP kvconnect_connector_event_resyncs_total AllCleared events announced because the store's feed of key events lost events (Stats.Resyncs).
# TYPE kvconnect_connector_event_resyncs_total counter
kvconnect_connector_event_resyncs_total{engine="e1",rank="3",role="worker"} 19
# HELP kvconnect_connector_failed_calls_total Calls to the store or transport that failed (Health.Failures).
# TYPE kvconnect_connector_failed_calls_total counter
kvconnect_connector_failed_calls_total{engine="e1",rank="3",role="worker"} 9
# HELP kvconnect_connector_failed_skipped_blocks_total Blocks a lookup found but did not match because their load failed lately (Stats.FailedSkipped).
# TYPE kvconnect_connector_failed_skipped_blocks_total counter
kvconnect_connector_failed_skipped_blocks_total{engine="e1",rank="3",role="worker"} 17
# HELP kvconnect_connector_healthy 1 when the latest call to the store or transport succeeded, 0 while it fails (Health.Healthy).
# TYPE kvconnect_connector_healthy gauge
kvconnect_connector_healthy{engine="e1",rank="3",role="worker"} 0
# HELP kvconnect_connector_hit_blocks_total Blocks matched from the store (Stats.HitBlocks).
# TYPE kvconnect_connector_hit_blocks_total counter
kvconnect_connector_hit_blocks_total{engine="e1",rank="3",role="worker"} 3
# HELP kvconnect_connector_hit_tokens_total Tokens matched from the store (Stats.HitTokens).
# TYPE kvconnect_connector_hit_tokens_total counter
kvconnect_connector_hit_tokens_total{engine="e1",rank="3",role="worker"} 4
# HELP kvconnect_connector_last_failure_timestamp_seconds Unix time of the latest failure (Health.LastErrorTime); absent before the first.
# TYPE kvconnect_connector_last_failure_timestamp_seconds gauge
kvconnect_connector_last_failure_timestamp_seconds{engine="e1",rank="3",role="worker"} 1.7648352e+09
# HELP kvconnect_connector_load_tokens_total Tokens of the blocks loaded, by the medium of the store tier that served them: CPU, DISK, STORAGE or other; counted only over a store that says which tier served a block (Stats.LoadTokensCPU, LoadTokensDisk, LoadTokensStorage, LoadTokensOther).
# TYPE kvconnect_connector_load_tokens_total counter
kvconnect_connector_load_tokens_total{engine="e1",medium="CPU",rank="3",role="worker"} 22
kvconnect_connector_load_tokens_total{engine="e1",medium="DISK",rank="3",role="worker"} 23
kvconnect_connector_load_tokens_total{engine="e1",medium="STORAGE",rank="3",role="worker"} 24
kvconnect_connector_load_tokens_total{engine="e1",medium="other",rank="3",role="worker"} 25
# HELP kvconnect_connector_lookup_keys_total Keys probed by lookups (Stats.LookupKeys).
# TYPE kvconnect_connector_lookup_keys_total counter
kvconnect_connector_lookup_keys_total{engine="e1",rank="3",role="worker"} 2
# HELP kvconnect_connector_lookup_seconds_total Time spent in lookups (Stats.LookupNanos).
# TYPE kvconnect_connector_lookup_seconds_total counter
kvconnect_connector_lookup_seconds_total{engine="e1",rank="3",role="worker"} 1.5
# HELP kvconnect_connector_lookups_total Exists probes of the store started (Stats.Lookups).
# TYPE kvconnect_connector_lookups_total counter
kvconnect_connector_lookups_total{engine="e1",rank="3",role="worker"} 1
# HELP kvconnect_connector_refused_params_total Transfer parameters refused: malformed, of another identity, forged, or unverifiable (Stats.Refused).
# TYPE kvconnect_connector_refused_params_total counter
kvconnect_connector_refused_params_total{engine="e1",rank="3",role="worker"} 18
# HELP kvconnect_connector_save_retries_total Blocks requeued after an out-of-space put (Stats.SaveRetries).
# TYPE kvconnect_connector_save_retries_total counter
kvconnect_connector_save_retries_total{engine="e1",rank="3",role="worker"} 12
# HELP kvconnect_connector_slow_skipped_blocks_total Blocks a lookup found but did not match because loads from the store (or from the tier holding them) ran slower than the engine's prefill (Stats.SlowSkipped).
# TYPE kvconnect_connector_slow_skipped_blocks_total counter
kvconnect_connector_slow_skipped_blocks_total{engine="e1",rank="3",role="worker"} 21
# HELP kvconnect_connector_staged_bytes_total Bytes copied through a staging buffer (Stats.StagedBytes).
# TYPE kvconnect_connector_staged_bytes_total counter
kvconnect_connector_staged_bytes_total{engine="e1",rank="3",role="worker"} 13
# HELP kvconnect_connector_stale_discarded_total Transfers of an old weights generation dropped (Stats.StaleDiscarded).
# TYPE kvconnect_connector_stale_discarded_total counter
kvconnect_connector_stale_discarded_total{engine="e1",rank="3",role="worker"} 14
# HELP kvconnect_connector_store_failures_total Store calls that failed, by reason: timeout (ran past their deadline, Stats.StoreTimeouts) or error (every other failure, Stats.StoreErrors minus StoreTimeouts).
# TYPE kvconnect_connector_store_failures_total counter
kvconnect_connector_store_failures_total{engine="e1",rank="3",reason="error",role="worker"} 4
kvconnect_connector_store_failures_total{engine="e1",rank="3",reason="timeout",role="worker"} 16
# HELP kvconnect_connector_transfer_seconds_total Time spent in loads and saves (Stats.TransferNanos).
# TYPE kvconnect_connector_transfer_seconds_total counter
kvconnect_connector_transfer_seconds_total{engine="e1",rank="3",role="worker"} 0.25
`

// TestWorker checks every metric of a worker's collector, exactly.
func TestWorker(t *testing.T) {
	w := &fakeWorker{st: stats(0), h: connector.Health{
		ConsecutiveFailures: 2, Failures: 9,
		LastError:     errors.New("store get: key tenant@ns@secret-hash: transfer failed"),
		LastErrorTime: time.Unix(1764835200, 0),
	}}
	c := prom.NewWorker(w, 3, prom.Options{Labels: prometheus.Labels{"engine": "e1"}})
	if err := testutil.CollectAndCompare(c, strings.NewReader(workerWant)); err != nil {
		t.Error(err)
	}
	// The error's text, which names a key, is in no label or help.
	out := scrape(t, c)
	if !strings.Contains(out, "kvconnect_connector_healthy{") || strings.Contains(out, "secret") {
		t.Errorf("the scrape lacks the health gauge or holds Health.LastError's text:\n%s", out)
	}
}

// TestSchedulerRefresh checks that a scrape of a scheduler half's
// collector never calls Stats, and exports the Stats of the latest
// Refresh; Health is read at scrape time.
func TestSchedulerRefresh(t *testing.T) {
	s := &fakeScheduler{st: stats(100)}
	c := prom.NewScheduler(s, prom.Options{})
	const before = `
# HELP kvconnect_connector_hit_tokens_total Tokens matched from the store (Stats.HitTokens).
# TYPE kvconnect_connector_hit_tokens_total counter
kvconnect_connector_hit_tokens_total{rank="",role="scheduler"} 0
# HELP kvconnect_connector_healthy 1 when the latest call to the store or transport succeeded, 0 while it fails (Health.Healthy).
# TYPE kvconnect_connector_healthy gauge
kvconnect_connector_healthy{rank="",role="scheduler"} 1
`
	names := []string{"kvconnect_connector_hit_tokens_total", "kvconnect_connector_healthy", "kvconnect_connector_last_failure_timestamp_seconds"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(before), names...); err != nil {
		t.Errorf("before Refresh: %v", err)
	}
	if s.calls != 0 {
		t.Errorf("a scrape called the scheduler half's Stats %d times, want 0", s.calls)
	}
	c.Refresh()
	s.st.HitTokens = 1 << 20 // after the Refresh: not exported yet
	s.h = connector.Health{ConsecutiveFailures: 1, Failures: 1, LastErrorTime: time.Unix(1764835201, 500_000_000)}
	const after = `
# HELP kvconnect_connector_hit_tokens_total Tokens matched from the store (Stats.HitTokens).
# TYPE kvconnect_connector_hit_tokens_total counter
kvconnect_connector_hit_tokens_total{rank="",role="scheduler"} 104
# HELP kvconnect_connector_healthy 1 when the latest call to the store or transport succeeded, 0 while it fails (Health.Healthy).
# TYPE kvconnect_connector_healthy gauge
kvconnect_connector_healthy{rank="",role="scheduler"} 0
# HELP kvconnect_connector_last_failure_timestamp_seconds Unix time of the latest failure (Health.LastErrorTime); absent before the first.
# TYPE kvconnect_connector_last_failure_timestamp_seconds gauge
kvconnect_connector_last_failure_timestamp_seconds{rank="",role="scheduler"} 1.7648352015e+09
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(after), names...); err != nil {
		t.Errorf("after Refresh: %v", err)
	}
	if s.calls != 1 {
		t.Errorf("Stats called %d times, want 1 (by Refresh)", s.calls)
	}
}

// TestStoreFailuresClamped checks that a snapshot with more timeouts than
// store errors exports no negative count.
func TestStoreFailuresClamped(t *testing.T) {
	w := &fakeWorker{st: connector.Stats{StoreErrors: 2, StoreTimeouts: 3}}
	c := prom.NewWorker(w, 0, prom.Options{})
	const want = `
# HELP kvconnect_connector_store_failures_total Store calls that failed, by reason: timeout (ran past their deadline, Stats.StoreTimeouts) or error (every other failure, Stats.StoreErrors minus StoreTimeouts).
# TYPE kvconnect_connector_store_failures_total counter
kvconnect_connector_store_failures_total{rank="0",reason="error",role="worker"} 0
kvconnect_connector_store_failures_total{rank="0",reason="timeout",role="worker"} 3
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "kvconnect_connector_store_failures_total"); err != nil {
		t.Error(err)
	}
}

// TestBareHalf checks that a half with neither optional interface
// exports nothing, and registers.
func TestBareHalf(t *testing.T) {
	c := prom.NewWorker(bareWorker{}, 0, prom.Options{})
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Errorf("CollectAndCount(bare worker) = %d, want 0", n)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Errorf("Register(bare worker) = %v, want nil", err)
	}
}

// TestRanks checks how workers combine: one collector per rank on one
// registry, each series labelled with its rank, a sum over ranks in the
// query; a rank registered twice is refused.
func TestRanks(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	w0 := &fakeWorker{st: connector.Stats{Loads: 10, LoadBytes: 1000}}
	w1 := &fakeWorker{st: connector.Stats{Loads: 32, LoadBytes: 3200}, h: connector.Health{ConsecutiveFailures: 1, Failures: 1}}
	reg.MustRegister(prom.NewWorker(w0, 0, prom.Options{}), prom.NewWorker(w1, 1, prom.Options{}))
	const want = `
# HELP kvconnect_connector_bytes_total Block bytes moved, by operation (load, save) (Stats.LoadBytes, SaveBytes).
# TYPE kvconnect_connector_bytes_total counter
kvconnect_connector_bytes_total{operation="load",rank="0",role="worker"} 1000
kvconnect_connector_bytes_total{operation="load",rank="1",role="worker"} 3200
kvconnect_connector_bytes_total{operation="save",rank="0",role="worker"} 0
kvconnect_connector_bytes_total{operation="save",rank="1",role="worker"} 0
# HELP kvconnect_connector_healthy 1 when the latest call to the store or transport succeeded, 0 while it fails (Health.Healthy).
# TYPE kvconnect_connector_healthy gauge
kvconnect_connector_healthy{rank="0",role="worker"} 1
kvconnect_connector_healthy{rank="1",role="worker"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvconnect_connector_bytes_total", "kvconnect_connector_healthy"); err != nil {
		t.Error(err)
	}
	// sum without (rank) (kvconnect_connector_blocks_total{operation="load",status="ok"})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "kvconnect_connector_blocks_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labels(m.GetLabel())["operation"] == "load" && labels(m.GetLabel())["status"] == "ok" {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	if sum != 42 {
		t.Errorf("sum over ranks of loaded blocks = %v, want 42", sum)
	}
	if err := reg.Register(prom.NewWorker(&fakeWorker{}, 1, prom.Options{})); err == nil {
		t.Error("Register of a second collector of rank 1 = nil, want an error")
	}
}

// TestReservedLabel checks that a constant label the package sets itself
// panics at construction.
func TestReservedLabel(t *testing.T) {
	for _, name := range []string{"role", "rank", "operation", "status", "source", "reason"} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("NewWorker with Options.Labels[%q] did not panic", name)
				}
			}()
			prom.NewWorker(&fakeWorker{}, 0, prom.Options{Labels: prometheus.Labels{name: "x"}})
		})
	}
}
