package prom

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// op is an operation label value of the instrumented store.
type op int

const (
	opExists op = iota
	opPut       // Put and PutV
	opGet       // Get and GetV
	opRemove
	opRemovePrefix
	opRemoveAll
	numOps
)

var opNames = [numOps]string{"exists", "put", "get", "remove", "remove_prefix", "remove_all"}

// status is a status label value of the instrumented store: the outcome
// of a call or of one key, from the store's sentinel errors.
type status int

const (
	stOK status = iota
	stNotFound
	stNoSpace
	stLeaseExpired
	stHasLease
	stBufferTooSmall
	stInvalidKey
	stInvalidRegion
	stTransfer
	stClosed
	stUnavailable
	stTimeout
	stCanceled
	stError
	numStatus
)

var statusNames = [numStatus]string{
	"ok", "not_found", "no_space", "lease_expired", "has_lease", "buffer_too_small",
	"invalid_key", "invalid_region", "transfer", "closed", "unavailable",
	"timeout", "canceled", "error",
}

// statusOf maps an error of a store call, or of one key, to its status.
// A context's error comes first: a deadline is a timeout whatever the
// store wrapped it in.
func statusOf(err error) status {
	switch {
	case err == nil:
		return stOK
	case errors.Is(err, store.ErrNotFound):
		return stNotFound
	case errors.Is(err, context.DeadlineExceeded):
		return stTimeout
	case errors.Is(err, context.Canceled):
		return stCanceled
	case errors.Is(err, store.ErrNoSpace):
		return stNoSpace
	case errors.Is(err, store.ErrLeaseExpired):
		return stLeaseExpired
	case errors.Is(err, store.ErrHasLease):
		return stHasLease
	case errors.Is(err, store.ErrBufferTooSmall):
		return stBufferTooSmall
	case errors.Is(err, store.ErrInvalidKey):
		return stInvalidKey
	case errors.Is(err, store.ErrInvalidRegion):
		return stInvalidRegion
	case errors.Is(err, store.ErrTransfer):
		return stTransfer
	case errors.Is(err, store.ErrClosed):
		return stClosed
	case errors.Is(err, store.ErrUnavailable):
		return stUnavailable
	}
	return stError
}

// operationBuckets are the bounds of the latency histogram, in seconds:
// exactly those of vLLM's vllm:mooncake_store_operation_time_seconds
// (vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/metrics.py),
// 1 ms to 4 s, so that a panel's histogram_quantile reads the same over
// both.
func operationBuckets() []float64 {
	return []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 4}
}

// histCell and countCell are one (operation, status) series, made when
// the collector is, exported once used: a series of every status for
// every operation would be mostly zeros.
type (
	histCell struct {
		used atomic.Bool
		h    prometheus.Histogram
	}
	countCell struct {
		used atomic.Bool
		c    prometheus.Counter
	}
)

func (c *histCell) observe(seconds float64) {
	if !c.used.Load() {
		c.used.Store(true)
	}
	c.h.Observe(seconds)
}

func (c *countCell) add(n int) {
	if !c.used.Load() {
		c.used.Store(true)
	}
	c.c.Add(float64(n))
}

// storeMetrics are the series of an instrumented store.
type storeMetrics struct {
	// epoch is when the metrics were made: calls are timed as durations
	// since it, which read only the monotonic clock (time.Now reads the
	// wall clock too, and costs twice as much).
	epoch time.Time
	dur   [numOps][numStatus]histCell
	keys  [numOps][numStatus]countCell
	bytes [numOps]prometheus.Counter // put and get only
}

func newStoreMetrics(opts Options) *storeMetrics {
	m := &storeMetrics{epoch: time.Now()}
	for o := range numOps {
		for st := range numStatus {
			labels := opts.labels(prometheus.Labels{"operation": opNames[o], "status": statusNames[st]})
			m.dur[o][st].h = prometheus.NewHistogram(prometheus.HistogramOpts{
				Namespace:   namespace,
				Subsystem:   "store",
				Name:        "operation_duration_seconds",
				Help:        "Time of the calls to the store, by operation and the call's status; its _count counts the calls.",
				ConstLabels: labels,
				Buckets:     operationBuckets(),
			})
			m.keys[o][st].c = prometheus.NewCounter(prometheus.CounterOpts{
				Namespace:   namespace,
				Subsystem:   "store",
				Name:        "operation_keys_total",
				Help:        "Keys named by the calls to the store, by operation and the key's status (a key of a call that failed whole has the call's status).",
				ConstLabels: labels,
			})
		}
		// Every operation's successes are exported from the start.
		m.dur[o][stOK].used.Store(true)
		m.keys[o][stOK].used.Store(true)
	}
	for _, o := range []op{opPut, opGet} {
		m.bytes[o] = prometheus.NewCounter(prometheus.CounterOpts{
			Namespace:   namespace,
			Subsystem:   "store",
			Name:        "operation_bytes_total",
			Help:        "Value bytes of the keys that succeeded, by operation: put (the bytes offered, present keys included), get (the bytes read).",
			ConstLabels: opts.labels(prometheus.Labels{"operation": opNames[o]}),
		})
	}
	return m
}

func (m *storeMetrics) describe(ch chan<- *prometheus.Desc) {
	for o := range numOps {
		for st := range numStatus {
			ch <- m.dur[o][st].h.Desc()
			ch <- m.keys[o][st].c.Desc()
		}
		if m.bytes[o] != nil {
			ch <- m.bytes[o].Desc()
		}
	}
}

func (m *storeMetrics) collect(ch chan<- prometheus.Metric) {
	for o := range numOps {
		for st := range numStatus {
			if c := &m.dur[o][st]; c.used.Load() {
				ch <- c.h
			}
			if c := &m.keys[o][st]; c.used.Load() {
				ch <- c.c
			}
		}
		if m.bytes[o] != nil {
			ch <- m.bytes[o]
		}
	}
}

// now returns the time since the epoch, from the monotonic clock.
func (m *storeMetrics) now() time.Duration { return time.Since(m.epoch) }

// batch records a batch call of o over n keys that started at start (from
// now) and returned err, with results res.
func (m *storeMetrics) batch(o op, start time.Duration, err error, n int, res []store.Result) {
	seconds := (m.now() - start).Seconds()
	cs := statusOf(err)
	m.dur[o][cs].observe(seconds)
	if err != nil {
		m.keys[o][cs].add(n)
		return
	}
	var counts [numStatus]int
	bytes := 0
	for i := range res {
		st := statusOf(res[i].Err)
		counts[st]++
		if st == stOK {
			bytes += res[i].N
		}
	}
	for st, k := range counts {
		if k > 0 {
			m.keys[o][st].add(k)
		}
	}
	if m.bytes[o] != nil && bytes > 0 {
		m.bytes[o].Add(float64(bytes))
	}
}

// removal records a removal call of o that started at start (from now),
// removed n keys and returned err.
func (m *storeMetrics) removal(o op, start time.Duration, n int, err error) {
	seconds := (m.now() - start).Seconds()
	cs := statusOf(err)
	m.dur[o][cs].observe(seconds)
	switch {
	case o == opRemove:
		m.keys[o][cs].add(1)
	case n > 0:
		m.keys[o][stOK].add(n)
	}
}

// Instrumented is a [store.Store] that times and counts the calls made
// through it, and the [prometheus.Collector] of those metrics. Make one
// with [InstrumentStore].
type Instrumented interface {
	store.Store
	prometheus.Collector
	// Unwrap returns the wrapped store.
	Unwrap() store.Store
}

// instrumented is an Instrumented store over a store without
// store.Vectored or store.Leaser; the other types add them.
type instrumented struct {
	s store.Store
	m *storeMetrics
}

type (
	instrumentedVectored struct {
		*instrumented
		v store.Vectored
	}
	instrumentedLeaser struct {
		*instrumented
		l store.Leaser
	}
	instrumentedVectoredLeaser struct {
		*instrumentedVectored
		l store.Leaser
	}
)

var (
	_ Instrumented   = (*instrumented)(nil)
	_ Instrumented   = (*instrumentedVectored)(nil)
	_ store.Vectored = (*instrumentedVectored)(nil)
	_ Instrumented   = (*instrumentedLeaser)(nil)
	_ store.Leaser   = (*instrumentedLeaser)(nil)
	_ Instrumented   = (*instrumentedVectoredLeaser)(nil)
	_ store.Vectored = (*instrumentedVectoredLeaser)(nil)
	_ store.Leaser   = (*instrumentedVectoredLeaser)(nil)
)

// InstrumentStore returns s with every call timed and counted, as
// kvconnect_store_operation_* metrics carrying the labels of opts (see
// the package doc). The result implements [store.Vectored] if s does,
// [store.Leaser] if s does, and [store.Layered] if s does (a store in
// tiers), so that a connector takes the same path over it as over s;
// PutV and GetV count as the operations put and get, ExistsTier as
// exists, GetTier and GetVTier as get.
// Register, Unregister, Stats and Close are passed through, not counted.
//
// Recording a call allocates nothing and adds no lock: each series is
// made here. It panics if s is nil (there is nothing to instrument: the
// wrapper would fail at its first call instead, far from the mistake)
// or if opts.Labels names a label the package sets (see [Options]), as
// every constructor of the package does on a programming error. Two
// instrumented stores registered together need a label of opts that
// tells them apart (see [Register]).
func InstrumentStore(s store.Store, opts Options) Instrumented {
	if s == nil {
		panic("prom: InstrumentStore(nil, ...): the store s is nil; pass the open store the connector is to call")
	}
	i := &instrumented{s: s, m: newStoreMetrics(opts)}
	v, vectored := s.(store.Vectored)
	l, leaser := s.(store.Leaser)
	y, isLayered := s.(store.Layered)
	ly := layered{m: i.m, y: y}
	switch {
	case vectored && leaser && isLayered:
		return &layeredVectoredLeaser{&instrumentedVectoredLeaser{instrumentedVectored: &instrumentedVectored{instrumented: i, v: v}, l: l}, ly}
	case vectored && leaser:
		return &instrumentedVectoredLeaser{instrumentedVectored: &instrumentedVectored{instrumented: i, v: v}, l: l}
	case vectored && isLayered:
		return &layeredVectored{&instrumentedVectored{instrumented: i, v: v}, ly}
	case vectored:
		return &instrumentedVectored{instrumented: i, v: v}
	case leaser && isLayered:
		return &layeredLeaser{&instrumentedLeaser{instrumented: i, l: l}, ly}
	case leaser:
		return &instrumentedLeaser{instrumented: i, l: l}
	case isLayered:
		return &layeredPlain{i, ly}
	}
	return i
}

// Unwrap returns the wrapped store.
func (i *instrumented) Unwrap() store.Store { return i.s }

// Describe implements [prometheus.Collector].
func (i *instrumented) Describe(ch chan<- *prometheus.Desc) { i.m.describe(ch) }

// Collect implements [prometheus.Collector].
func (i *instrumented) Collect(ch chan<- prometheus.Metric) { i.m.collect(ch) }

// Exists implements [store.Store].
func (i *instrumented) Exists(ctx context.Context, keys []string, res []store.Result) error {
	start := i.m.now()
	err := i.s.Exists(ctx, keys, res)
	i.m.batch(opExists, start, err, len(keys), res)
	return err
}

// Put implements [store.Store].
func (i *instrumented) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	start := i.m.now()
	err := i.s.Put(ctx, keys, src, res)
	i.m.batch(opPut, start, err, len(keys), res)
	return err
}

// Get implements [store.Store].
func (i *instrumented) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	start := i.m.now()
	err := i.s.Get(ctx, keys, dst, res)
	i.m.batch(opGet, start, err, len(keys), res)
	return err
}

// Remove implements [store.Store].
func (i *instrumented) Remove(ctx context.Context, key string) error {
	start := i.m.now()
	err := i.s.Remove(ctx, key)
	i.m.removal(opRemove, start, 0, err)
	return err
}

// RemovePrefix implements [store.Store].
func (i *instrumented) RemovePrefix(ctx context.Context, prefix string) (int, error) {
	start := i.m.now()
	n, err := i.s.RemovePrefix(ctx, prefix)
	i.m.removal(opRemovePrefix, start, n, err)
	return n, err
}

// RemoveAll implements [store.Store].
func (i *instrumented) RemoveAll(ctx context.Context) (int, error) {
	start := i.m.now()
	n, err := i.s.RemoveAll(ctx)
	i.m.removal(opRemoveAll, start, n, err)
	return n, err
}

// Register implements [store.Store].
func (i *instrumented) Register(r rdma.Region) error { return i.s.Register(r) }

// Unregister implements [store.Store].
func (i *instrumented) Unregister(r rdma.Region) error { return i.s.Unregister(r) }

// Stats implements [store.Store]: the wrapped store's.
func (i *instrumented) Stats() store.Stats { return i.s.Stats() }

// Close implements [store.Store].
func (i *instrumented) Close() error { return i.s.Close() }

// PutV implements [store.Vectored], counted as a put.
func (i *instrumentedVectored) PutV(ctx context.Context, keys []string, src [][]rdma.Region, res []store.Result) error {
	start := i.m.now()
	err := i.v.PutV(ctx, keys, src, res)
	i.m.batch(opPut, start, err, len(keys), res)
	return err
}

// GetV implements [store.Vectored], counted as a get.
func (i *instrumentedVectored) GetV(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result) error {
	start := i.m.now()
	err := i.v.GetV(ctx, keys, dst, res)
	i.m.batch(opGet, start, err, len(keys), res)
	return err
}

// Leases implements [store.Leaser]: the wrapped store's.
func (i *instrumentedLeaser) Leases() store.Leases { return i.l.Leases() }

// Leases implements [store.Leaser]: the wrapped store's.
func (i *instrumentedVectoredLeaser) Leases() store.Leases { return i.l.Leases() }

// layered adds [store.Layered] to an instrumented store over a store in
// tiers: each shape of instrumented store has a layered twin.
type layered struct {
	m *storeMetrics
	y store.Layered
}

type (
	layeredPlain struct {
		*instrumented
		layered
	}
	layeredVectored struct {
		*instrumentedVectored
		layered
	}
	layeredLeaser struct {
		*instrumentedLeaser
		layered
	}
	layeredVectoredLeaser struct {
		*instrumentedVectoredLeaser
		layered
	}
)

var (
	_ store.Layered  = (*layeredPlain)(nil)
	_ store.Layered  = (*layeredVectored)(nil)
	_ store.Vectored = (*layeredVectored)(nil)
	_ store.Layered  = (*layeredLeaser)(nil)
	_ store.Leaser   = (*layeredLeaser)(nil)
	_ store.Layered  = (*layeredVectoredLeaser)(nil)
	_ store.Vectored = (*layeredVectoredLeaser)(nil)
	_ store.Leaser   = (*layeredVectoredLeaser)(nil)
	_ Instrumented   = (*layeredVectoredLeaser)(nil)
)

// Media implements [store.Layered]: the wrapped store's.
func (l layered) Media() []string { return l.y.Media() }

// ExistsTier implements [store.Layered], counted as an exists.
func (l layered) ExistsTier(ctx context.Context, keys []string, res []store.Result, tier []int) error {
	start := l.m.now()
	err := l.y.ExistsTier(ctx, keys, res, tier)
	l.m.batch(opExists, start, err, len(keys), res)
	return err
}

// GetTier implements [store.Layered], counted as a get.
func (l layered) GetTier(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result, tier []int) error {
	start := l.m.now()
	err := l.y.GetTier(ctx, keys, dst, res, tier)
	l.m.batch(opGet, start, err, len(keys), res)
	return err
}

// GetVTier implements [store.Layered], counted as a get.
func (l layered) GetVTier(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result, tier []int) error {
	start := l.m.now()
	err := l.y.GetVTier(ctx, keys, dst, res, tier)
	l.m.batch(opGet, start, err, len(keys), res)
	return err
}
