package prom_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvconnect/kvconnect/connector/prom"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/storetest"
	"github.com/kvconnect/kvconnect/store/tiered"
)

func newMemstore(t testing.TB, cfg memstore.Config) *memstore.Store {
	t.Helper()
	s, err := memstore.New(cfg)
	if err != nil {
		t.Fatalf("memstore.New(%+v) = %v", cfg, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestInstrumentedConformance runs the store harness over memstore
// wrapped, in the shapes memstore runs it: the wrapper changes nothing a
// caller sees, leases and vectored calls included.
func TestInstrumentedConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  memstore.Config
		opts storetest.Options
	}{
		{"Large", memstore.Config{Capacity: 8 << 20, Shards: 8}, storetest.Options{Capacity: 1 << 20, Stats: true, Counters: storetest.AllCounters}},
		{"Evicting", memstore.Config{Capacity: 64 << 10, Shards: 4}, storetest.Options{Evicts: true, Capacity: 64 << 10, Stats: true, Counters: storetest.AllCounters}},
		{"RequireRegistered", memstore.Config{Capacity: 8 << 20, RequireRegistered: true}, storetest.Options{Capacity: 1 << 20, Stats: true, Registration: true, Counters: storetest.AllCounters}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, func(t testing.TB) store.Store {
				return prom.InstrumentStore(newMemstore(t, tc.cfg), prom.Options{})
			}, tc.opts)
		})
	}
}

// plain hides every optional interface of the store it holds.
type plain struct{ store.Store }

// leaser is a store with store.Leaser and without store.Vectored.
type leaser struct {
	store.Store
	l store.Leases
}

func (l leaser) Leases() store.Leases { return l.l }

// TestInstrumentedInterfaces checks that the wrapper implements
// store.Vectored, store.Leaser and store.Layered exactly when the wrapped
// store does, and passes Leases and Media through; ExistsTier counts as
// an exists and GetTier as a get.
func TestInstrumentedInterfaces(t *testing.T) {
	mem := newMemstore(t, memstore.Config{Capacity: 1 << 20})
	top, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ts, err := tiered.New(tiered.Config{Tiers: []tiered.Tier{{Store: top, Medium: tiered.MediumCPU}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ts.Close() })
	leases := store.Leases{Exists: true, TTL: 5 * time.Second, RemoveWait: time.Second}
	type layeredStore struct {
		store.Store
		store.Layered
	}
	for _, tc := range []struct {
		name                      string
		s                         store.Store
		vectored, leaser, layered bool
	}{
		{"Memstore", mem, true, true, false},
		{"Plain", plain{mem}, false, false, false},
		{"Leaser", leaser{plain{mem}, leases}, false, true, false},
		{"Vectored", struct {
			store.Store
			store.Vectored
		}{plain{mem}, mem}, true, false, false},
		{"Tiered", ts, true, true, true},
		{"Layered", layeredStore{plain{ts}, ts}, false, false, true},
		{"LayeredLeaser", struct {
			leaser
			store.Layered
		}{leaser{plain{ts}, leases}, ts}, false, true, true},
		{"LayeredVectored", struct {
			store.Store
			store.Vectored
			store.Layered
		}{plain{ts}, ts, ts}, true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := prom.InstrumentStore(tc.s, prom.Options{})
			_, vectored := i.(store.Vectored)
			l, isLeaser := i.(store.Leaser)
			y, isLayered := i.(store.Layered)
			if vectored != tc.vectored || isLeaser != tc.leaser || isLayered != tc.layered {
				t.Errorf("InstrumentStore(%s): Vectored %v, Leaser %v, Layered %v; want %v, %v, %v", tc.name, vectored, isLeaser, isLayered, tc.vectored, tc.leaser, tc.layered)
			}
			if isLayered {
				if diff := cmp.Diff([]string{"CPU"}, y.Media()); diff != "" {
					t.Errorf("Media() (-want +got):\n%s", diff)
				}
				keys := []string{"absent"}
				res, tier := make([]store.Result, 1), []int{7}
				if err := y.ExistsTier(context.Background(), keys, res, tier); err != nil || tier[0] != -1 {
					t.Errorf("ExistsTier(%q) = %v, tier %d; want nil, -1", keys, err, tier[0])
				}
				if err := y.GetTier(context.Background(), keys, regions(t, 1, 64), res, tier); err != nil || tier[0] != -1 {
					t.Errorf("GetTier(%q) = %v, tier %d; want nil, -1", keys, err, tier[0])
				}
				got := histogramCounts(t, i, "kvconnect_store_operation_duration_seconds")
				if got["exists/ok"] != 1 || got["get/ok"] != 1 {
					t.Errorf("calls counted: exists/ok %d, get/ok %d; want 1, 1 (ExistsTier and GetTier)", got["exists/ok"], got["get/ok"])
				}
			}
			if isLeaser {
				want := tc.s.(store.Leaser).Leases()
				if diff := cmp.Diff(want, l.Leases()); diff != "" {
					t.Errorf("Leases() (-want +got):\n%s", diff)
				}
			}
			if i.Unwrap() != tc.s {
				t.Errorf("Unwrap() = %v, want the wrapped store", i.Unwrap())
			}
		})
	}
}

// regions returns n host regions of size bytes each.
func regions(t testing.TB, n, size int) []rdma.Region {
	t.Helper()
	mem, err := rdma.AllocHost(n * size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Free() })
	b := mem.Bytes()
	for i := range b {
		b[i] = byte(i)
	}
	rs := make([]rdma.Region, n)
	for i := range rs {
		rs[i], _ = mem.Region().Sub(i*size, size)
	}
	return rs
}

// histogramCounts returns the sample count of each series of the named
// histogram, by its operation and status labels ("get/ok").
func histogramCounts(t *testing.T, c prometheus.Collector, name string) map[string]uint64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := labels(m.GetLabel())
			h := m.GetHistogram()
			var bounds []float64
			for _, b := range h.GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
			}
			if diff := cmp.Diff(vllmMooncakeBuckets, bounds); diff != "" {
				t.Errorf("%s%v buckets (-want +got):\n%s", name, l, diff)
			}
			counts[l["operation"]+"/"+l["status"]] = h.GetSampleCount()
		}
	}
	return counts
}

// TestInstrumentedCounts checks what the wrapper counts of a sequence of
// calls over memstore: calls by operation and status in the histogram,
// keys by status, bytes of the keys that succeeded.
func TestInstrumentedCounts(t *testing.T) {
	s := prom.InstrumentStore(newMemstore(t, memstore.Config{Capacity: 1 << 20}), prom.Options{Labels: prometheus.Labels{"store": "local"}})
	ctx := context.Background()
	src := regions(t, 4, 1024)
	dst := regions(t, 4, 1024)
	res := make([]store.Result, 4)
	keys := []string{"t@a", "t@b", "t@c"}
	mustCall := func(name string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s = %v", name, err)
		}
	}
	mustCall("Put", s.Put(ctx, keys, src[:3], res[:3]))
	mustCall("Put (present)", s.Put(ctx, keys[:1], src[:1], res[:1]))
	mustCall("Get", s.Get(ctx, []string{"t@a", "t@b", "t@missing", "t@c"}, dst, res))
	mustCall("Exists", s.Exists(ctx, []string{"t@a", "t@missing", "bad key"}, res[:3]))
	mustCall("GetV", s.(store.Vectored).GetV(ctx, keys[:2], [][]rdma.Region{{dst[0]}, {dst[1]}}, res[:2]))
	if err := s.Remove(ctx, "t@missing"); err == nil {
		t.Fatal("Remove of an absent key = nil")
	}
	mustCall("Remove", s.Remove(ctx, "t@c"))
	if n, err := s.RemovePrefix(ctx, "t@"); err != nil || n != 2 {
		t.Fatalf("RemovePrefix = %d, %v; want 2, nil", n, err)
	}
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if err := s.Get(expired, keys, dst[:3], res[:3]); err == nil {
		t.Fatal("Get with an expired context = nil")
	}
	mustCall("Close", s.Close())
	if err := s.Exists(ctx, keys[:1], res[:1]); err == nil {
		t.Fatal("Exists after Close = nil")
	}

	const want = `
# HELP kvconnect_store_operation_bytes_total Value bytes of the keys that succeeded, by operation: put (the bytes offered, present keys included), get (the bytes read).
# TYPE kvconnect_store_operation_bytes_total counter
kvconnect_store_operation_bytes_total{operation="get",store="local"} 5120
kvconnect_store_operation_bytes_total{operation="put",store="local"} 4096
# HELP kvconnect_store_operation_keys_total Keys named by the calls to the store, by operation and the key's status (a key of a call that failed whole has the call's status).
# TYPE kvconnect_store_operation_keys_total counter
kvconnect_store_operation_keys_total{operation="exists",status="closed",store="local"} 1
kvconnect_store_operation_keys_total{operation="exists",status="invalid_key",store="local"} 1
kvconnect_store_operation_keys_total{operation="exists",status="not_found",store="local"} 1
kvconnect_store_operation_keys_total{operation="exists",status="ok",store="local"} 1
kvconnect_store_operation_keys_total{operation="get",status="not_found",store="local"} 1
kvconnect_store_operation_keys_total{operation="get",status="ok",store="local"} 5
kvconnect_store_operation_keys_total{operation="get",status="timeout",store="local"} 3
kvconnect_store_operation_keys_total{operation="put",status="ok",store="local"} 4
kvconnect_store_operation_keys_total{operation="remove",status="not_found",store="local"} 1
kvconnect_store_operation_keys_total{operation="remove",status="ok",store="local"} 1
kvconnect_store_operation_keys_total{operation="remove_all",status="ok",store="local"} 0
kvconnect_store_operation_keys_total{operation="remove_prefix",status="ok",store="local"} 2
`
	if err := testutil.CollectAndCompare(s, strings.NewReader(want), "kvconnect_store_operation_bytes_total", "kvconnect_store_operation_keys_total"); err != nil {
		t.Error(err)
	}
	got := histogramCounts(t, s, "kvconnect_store_operation_duration_seconds")
	wantCalls := map[string]uint64{
		"exists/ok": 1, "exists/closed": 1, "get/ok": 2, "get/timeout": 1, "put/ok": 2,
		"remove/ok": 1, "remove/not_found": 1, "remove_prefix/ok": 1, "remove_all/ok": 0,
	}
	if diff := cmp.Diff(wantCalls, got); diff != "" {
		t.Errorf("calls by operation/status (-want +got):\n%s", diff)
	}
}

// TestStatusOf checks the status of each of the store's errors, wrapped
// as stores wrap them, through the keys counter of a store that returns
// them.
func TestStatusOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{store.ErrNotFound, "not_found"},
		{store.ErrNoSpace, "no_space"},
		{store.ErrLeaseExpired, "lease_expired"},
		{store.ErrHasLease, "has_lease"},
		{store.ErrBufferTooSmall, "buffer_too_small"},
		{store.ErrInvalidKey, "invalid_key"},
		{store.ErrInvalidRegion, "invalid_region"},
		{store.ErrTransfer, "transfer"},
		{store.ErrClosed, "closed"},
		{store.ErrUnavailable, "unavailable"},
		{context.DeadlineExceeded, "timeout"},
		{fmt.Errorf("%w: rpc: %w", store.ErrTransfer, context.DeadlineExceeded), "timeout"},
		{context.Canceled, "canceled"},
		{fmt.Errorf("disk on fire"), "error"},
	} {
		name := tc.want
		if tc.err != nil {
			name = tc.err.Error()
		}
		t.Run(name, func(t *testing.T) {
			err := tc.err
			if err != nil {
				err = fmt.Errorf("mooncake: key %q: %w", "t@secret", err)
			}
			s := prom.InstrumentStore(errStore{err: err}, prom.Options{})
			res := make([]store.Result, 1)
			if err := s.Exists(context.Background(), []string{"t@secret"}, res); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf(`
# HELP kvconnect_store_operation_keys_total Keys named by the calls to the store, by operation and the key's status (a key of a call that failed whole has the call's status).
# TYPE kvconnect_store_operation_keys_total counter
kvconnect_store_operation_keys_total{operation="exists",status=%q} 1
`, tc.want)
			var ok []string
			for _, op := range []string{"exists", "get", "put", "remove", "remove_all", "remove_prefix"} {
				if op != "exists" || tc.want != "ok" {
					ok = append(ok, fmt.Sprintf("kvconnect_store_operation_keys_total{operation=%q,status=\"ok\"} 0", op))
				}
			}
			sort.Strings(ok)
			want = strings.Replace(want, "# TYPE kvconnect_store_operation_keys_total counter\n",
				"# TYPE kvconnect_store_operation_keys_total counter\n"+strings.Join(ok, "\n")+"\n", 1)
			if err := testutil.CollectAndCompare(s, strings.NewReader(want), "kvconnect_store_operation_keys_total"); err != nil {
				t.Error(err)
			}
			if out := scrape(t, s); strings.Contains(out, "secret") {
				t.Errorf("the scrape holds the key of the error:\n%s", out)
			}
		})
	}
}

// errStore is a store whose Exists reports err for every key.
type errStore struct {
	store.Store
	err error
}

func (s errStore) Exists(_ context.Context, keys []string, res []store.Result) error {
	for i := range res {
		res[i] = store.Result{Err: s.err}
	}
	return nil
}

// TestInstrumentedPedantic checks, with a pedantic registry, that what
// every collector of the package describes agrees with what it collects,
// registered together.
func TestInstrumentedPedantic(t *testing.T) {
	mem := newMemstore(t, memstore.Config{Capacity: 1 << 20})
	s := prom.InstrumentStore(mem, prom.Options{})
	ctx := context.Background()
	res := make([]store.Result, 2)
	if err := s.Put(ctx, []string{"t@a", "t@b"}, regions(t, 2, 64), res); err != nil {
		t.Fatal(err)
	}
	if err := s.Get(ctx, []string{"t@a", "t@z"}, regions(t, 2, 64), res); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(
		s,
		prom.NewStoreStats(mem, prom.Options{}),
		prom.NewScheduler(&fakeScheduler{st: stats(0)}, prom.Options{}),
		prom.NewWorker(&fakeWorker{st: stats(0)}, 0, prom.Options{}),
		prom.NewWorker(&fakeWorker{st: stats(0)}, 1, prom.Options{}),
		prom.NewPromptTokens(prom.Options{}),
	)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v", err)
	}
	if len(mfs) == 0 {
		t.Fatal("Gather() returned no metric families")
	}
}

// vllmMooncakeBuckets are the buckets of vLLM's
// vllm:mooncake_store_operation_time_seconds, as
// vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/metrics.py
// declares them.
var vllmMooncakeBuckets = []float64{1e-3, 5e-3, 1e-2, 5e-2, 1e-1, 2e-1, 3e-1, 4e-1, 5e-1, 7.5e-1, 1.0, 1.5, 2.0, 3.0, 4.0}
