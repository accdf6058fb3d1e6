package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// ErrInjected marks every error a [Faulty] store makes up. Injected errors
// also match the store sentinel they stand for (store.ErrTransfer,
// store.ErrNoSpace, ...), so code under test sees them as real ones and
// tests can still tell them apart.
var ErrInjected = errors.New("storetest: injected fault")

// Op is a set of store operations, for [FaultOptions.Ops].
type Op uint8

// Operations that faults can be injected into.
const (
	OpExists Op = 1 << iota
	OpPut
	OpGet
	OpRemove // Remove, RemovePrefix and RemoveAll

	OpAll = OpExists | OpPut | OpGet | OpRemove
)

// FaultOptions configures a [Faulty] store. Rates are probabilities in
// [0, 1]; the zero FaultOptions injects nothing.
type FaultOptions struct {
	// Seed selects the faults. The same seed, with the same calls, gives
	// the same faults (see [Faulty]).
	Seed uint64

	// Ops are the operations that get faults; zero means OpAll.
	Ops Op

	// CallRate is the probability that a call fails as a whole, doing
	// nothing, with an error matching ErrInjected and store.ErrTransfer.
	CallRate float64

	// KeyRate is the probability that one key of a batch call fails alone
	// (a partial batch failure): the key is not passed to the store, and
	// its result is an error matching ErrInjected and one of PutErrors,
	// GetErrors or ExistsErrors.
	KeyRate float64

	// PutErrors, GetErrors and ExistsErrors are the errors per-key faults
	// draw from, for each operation. Defaults: store.ErrNoSpace and
	// store.ErrTransfer for puts; store.ErrTransfer and store.ErrNotFound
	// for gets; store.ErrTransfer for exists.
	PutErrors, GetErrors, ExistsErrors []error

	// VanishRate is the probability that a key Exists reports present is
	// removed from the store right after, as if evicted between an exists
	// and the get that follows it: that get then finds nothing. Over a
	// store whose removals respect read leases, the exists may have leased
	// the key and the removal be refused: the key then stays (Faults
	// counts only keys that vanished).
	VanishRate float64

	// Latency is added to every call, before it runs; a context done
	// during the wait fails the call with the context's error.
	Latency time.Duration

	// Bandwidth, when positive, is the bytes per second of the one link
	// over which every put and get moves its values, after Latency: a
	// call waits until its bytes (the lengths of its regions) have
	// crossed, queued behind those of the calls before it, as on a
	// saturated network. It models a store whose transfers take time in
	// proportion to their size, which Latency alone does not.
	Bandwidth int64

	// Scribble makes a get whose key fails by injection overwrite its
	// destination (host memory only) with garbage, as a failed transfer
	// may: code under test must not use the bytes of a failed get.
	Scribble bool
}

// FaultCounts counts the faults a [Faulty] store injected.
type FaultCounts struct {
	Calls    int64 // whole calls failed
	Keys     int64 // keys of batch calls failed
	Vanished int64 // keys removed after Exists reported them
}

// Faulty is a store that wraps another and injects faults into its calls:
// whole-call errors, per-key errors in batches, keys that vanish between
// Exists and Get, and latency. It is for the tests of code that uses a
// store, in the spirit of an error-injecting file system: run it over an
// embedded store and check that the code under test survives every fault.
// Make one with [NewFaulty].
//
// Faults are a pure function of the seed, the operation, the keys, and how
// many times before the same operation was asked of the same key (or, for
// whole-call faults, of the same batch of keys). So a run that makes the
// same calls sees the same faults, however goroutines interleave calls on
// different keys. A Faulty store is safe for concurrent use.
//
// A Faulty store implements [store.Vectored] and [store.Leaser] exactly
// when the store it wraps does, so that code which checks for them takes
// the same path over the wrapper as over the store (Leases is the wrapped
// store's: faults add no leases). PutV and GetV get the faults of Put and
// Get (OpPut, OpGet): the same whole-call and per-key errors, drawn alike,
// and Scribble writes over every host region of a faulted GetV key.
//
// Bad input (invalid keys, slices of different lengths) is never faulted:
// it gets the wrapped store's errors.
type Faulty interface {
	store.Store
	// Faults returns how many faults the store injected so far.
	Faults() FaultCounts
	// Unwrap returns the wrapped store.
	Unwrap() store.Store
}

// faulty is a Faulty store over a store without store.Vectored.
type faulty struct {
	s    store.Store
	opts FaultOptions
	put  []error // injected per-key errors, ready made
	get  []error
	ex   []error
	call error

	mu       sync.Mutex
	counts   map[uint64]uint64 // per (operation, keys): calls so far
	faults   FaultCounts
	linkFree time.Time // when the link of Bandwidth has moved every byte asked of it so far
}

// faultyVectored is a Faulty store over a store with store.Vectored.
type faultyVectored struct {
	*faulty
	v store.Vectored
}

// faultyLeaser and faultyVectoredLeaser are Faulty stores over a store
// with store.Leaser, and without or with store.Vectored.
type (
	faultyLeaser struct {
		*faulty
		l store.Leaser
	}
	faultyVectoredLeaser struct {
		*faultyVectored
		l store.Leaser
	}
)

var (
	_ Faulty         = (*faulty)(nil)
	_ Faulty         = (*faultyVectored)(nil)
	_ store.Vectored = (*faultyVectored)(nil)
	_ Faulty         = (*faultyLeaser)(nil)
	_ store.Leaser   = (*faultyLeaser)(nil)
	_ Faulty         = (*faultyVectoredLeaser)(nil)
	_ store.Vectored = (*faultyVectoredLeaser)(nil)
	_ store.Leaser   = (*faultyVectoredLeaser)(nil)
)

// NewFaulty returns s with faults injected as opts says; the result
// implements store.Vectored if s does, and store.Leaser if s does. It
// panics if a rate is outside [0, 1] or Latency is negative: those are
// programming errors of the test.
func NewFaulty(s store.Store, opts FaultOptions) Faulty {
	f := newFaulty(s, opts)
	v, vectored := s.(store.Vectored)
	l, leaser := s.(store.Leaser)
	switch {
	case vectored && leaser:
		return &faultyVectoredLeaser{faultyVectored: &faultyVectored{faulty: f, v: v}, l: l}
	case vectored:
		return &faultyVectored{faulty: f, v: v}
	case leaser:
		return &faultyLeaser{faulty: f, l: l}
	}
	return f
}

// Leases returns the wrapped store's Leases.
func (f *faultyLeaser) Leases() store.Leases { return f.l.Leases() }

// Leases returns the wrapped store's Leases.
func (f *faultyVectoredLeaser) Leases() store.Leases { return f.l.Leases() }

func newFaulty(s store.Store, opts FaultOptions) *faulty {
	for _, r := range []struct {
		name string
		v    float64
	}{{"CallRate", opts.CallRate}, {"KeyRate", opts.KeyRate}, {"VanishRate", opts.VanishRate}} {
		if !(r.v >= 0 && r.v <= 1) {
			panic(fmt.Sprintf("storetest: FaultOptions.%s %v: must be in [0, 1]", r.name, r.v))
		}
	}
	if opts.Latency < 0 {
		panic(fmt.Sprintf("storetest: FaultOptions.Latency %v: must not be negative", opts.Latency))
	}
	if opts.Bandwidth < 0 {
		panic(fmt.Sprintf("storetest: FaultOptions.Bandwidth %d: must not be negative", opts.Bandwidth))
	}
	if opts.Ops == 0 {
		opts.Ops = OpAll
	}
	inject := func(errs []error, defaults ...error) []error {
		if len(errs) == 0 {
			errs = defaults
		}
		out := make([]error, len(errs))
		for i, e := range errs {
			out[i] = fmt.Errorf("%w: %w", ErrInjected, e)
		}
		return out
	}
	return &faulty{
		s:      s,
		opts:   opts,
		put:    inject(opts.PutErrors, store.ErrNoSpace, store.ErrTransfer),
		get:    inject(opts.GetErrors, store.ErrTransfer, store.ErrNotFound),
		ex:     inject(opts.ExistsErrors, store.ErrTransfer),
		call:   fmt.Errorf("%w: %w", ErrInjected, store.ErrTransfer),
		counts: map[uint64]uint64{},
	}
}

// Unwrap returns the wrapped store.
func (f *faulty) Unwrap() store.Store { return f.s }

// Faults returns how many faults f injected so far.
func (f *faulty) Faults() FaultCounts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.faults
}

// Salts that keep the decisions of different kinds apart.
const (
	saltCall uint64 = iota + 1
	saltKey
	saltPick
	saltVanish
)

// draw returns a number in [0, 1) for the nth time the pair (op, h) is
// asked about, and counts the asking.
func (f *faulty) draw(op Op, salt, h uint64) float64 {
	id := mix(mix(uint64(op)<<8|salt) ^ h)
	f.mu.Lock()
	n := f.counts[id]
	f.counts[id] = n + 1
	f.mu.Unlock()
	x := mix(f.opts.Seed ^ mix(id+n*0x9e3779b97f4a7c15))
	return float64(x>>11) / (1 << 53)
}

// pick chooses one of errs, also deterministically.
func (f *faulty) pick(op Op, h uint64, errs []error) error {
	u := f.draw(op, saltPick, h)
	return errs[min(len(errs)-1, int(math.Floor(u*float64(len(errs)))))]
}

// begin waits the latency and decides a whole-call fault. A put or get
// over a link of FaultOptions.Bandwidth waits its latency in wire instead,
// together with its bytes: one wait per call.
func (f *faulty) begin(ctx context.Context, op Op, keys ...string) error {
	if f.opts.Latency > 0 && !(f.opts.Bandwidth > 0 && op&(OpPut|OpGet) != 0) {
		timer := time.NewTimer(f.opts.Latency)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
	if f.opts.Ops&op == 0 || f.opts.CallRate == 0 {
		return nil
	}
	h := uint64(len(keys))
	for _, k := range keys {
		h = mix(h ^ hashString(k))
	}
	if f.draw(op, saltCall, h) < f.opts.CallRate {
		f.mu.Lock()
		f.faults.Calls++
		f.mu.Unlock()
		return f.call
	}
	return nil
}

// wire waits the call's latency and then until the bytes of regs
// (rdma.Region or []rdma.Region) have crossed the link of
// FaultOptions.Bandwidth, behind the bytes of earlier calls.
func wire[R any](f *faulty, ctx context.Context, regs []R) error {
	if f.opts.Bandwidth <= 0 {
		return nil
	}
	n := 0
	for _, r := range regs {
		switch r := any(r).(type) {
		case rdma.Region:
			n += r.Len
		case []rdma.Region:
			for _, x := range r {
				n += x.Len
			}
		}
	}
	d := time.Duration(float64(n) / float64(f.opts.Bandwidth) * float64(time.Second))
	f.mu.Lock()
	start := time.Now().Add(f.opts.Latency) // the bytes start once the call's latency is over
	if f.linkFree.After(start) {
		start = f.linkFree
	}
	end := start.Add(d)
	f.linkFree = end
	f.mu.Unlock()
	timer := time.NewTimer(time.Until(end))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// keyFault returns the error injected into key, or nil.
func (f *faulty) keyFault(op Op, key string, errs []error) error {
	if f.opts.Ops&op == 0 || f.opts.KeyRate == 0 || store.ValidateKey(key) != nil {
		return nil
	}
	h := hashString(key)
	if f.draw(op, saltKey, h) >= f.opts.KeyRate {
		return nil
	}
	f.mu.Lock()
	f.faults.Keys++
	f.mu.Unlock()
	return f.pick(op, h, errs)
}

// Exists passes the call on, with faults.
func (f *faulty) Exists(ctx context.Context, keys []string, res []store.Result) error {
	if err := store.CheckBatch("exists", len(keys), -1, len(res)); err != nil {
		return err
	}
	if err := f.begin(ctx, OpExists, keys...); err != nil {
		return err
	}
	fwd, fres, faulted := f.split(OpExists, keys, res, f.ex)
	if len(fwd) > 0 {
		if err := f.s.Exists(ctx, fwd, fres); err != nil {
			return err
		}
	}
	f.merge(res, fres, faulted)
	if f.opts.VanishRate == 0 || f.opts.Ops&OpExists == 0 {
		return nil
	}
	for i, k := range keys {
		if res[i].Err != nil || f.draw(OpExists, saltVanish, hashString(k)) >= f.opts.VanishRate {
			continue
		}
		if err := f.s.Remove(ctx, k); err == nil {
			f.mu.Lock()
			f.faults.Vanished++
			f.mu.Unlock()
		}
	}
	return nil
}

// Put passes the call on, with faults: a key that fails by injection is
// not stored.
func (f *faulty) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	return forward(f, ctx, OpPut, keys, src, res, f.s.Put, nil)
}

// PutV passes the call on, with the faults of Put.
func (f *faultyVectored) PutV(ctx context.Context, keys []string, src [][]rdma.Region, res []store.Result) error {
	return forward(f.faulty, ctx, OpPut, keys, src, res, f.v.PutV, nil)
}

// GetV passes the call on, with the faults of Get.
func (f *faultyVectored) GetV(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result) error {
	return forward(f.faulty, ctx, OpGet, keys, dst, res, f.v.GetV, func(rs []rdma.Region) []rdma.Region { return rs })
}

// forward is a put or get (op) with faults: the keys that fail by
// injection are answered here, the others passed on with their regions
// (one region or a list of them, R) to call. For a get with Scribble on,
// scribble turns a faulted key's destination into regions to scribble.
func forward[R any](f *faulty, ctx context.Context, op Op, keys []string, regs []R, res []store.Result, call func(context.Context, []string, []R, []store.Result) error, scribble func(R) []rdma.Region) error {
	name := "put"
	if op == OpGet {
		name = "get"
	}
	if err := store.CheckBatch(name, len(keys), len(regs), len(res)); err != nil {
		return err
	}
	if err := f.begin(ctx, op, keys...); err != nil {
		return err
	}
	if err := wire(f, ctx, regs); err != nil {
		return err
	}
	errs := f.put
	if op == OpGet {
		errs = f.get
	}
	fwd, fres, faulted := f.split(op, keys, res, errs)
	if len(fwd) > 0 {
		if err := call(ctx, fwd, pick(regs, faulted), fres); err != nil {
			return err
		}
	}
	f.merge(res, fres, faulted)
	if scribble != nil && f.opts.Scribble {
		for i, bad := range faulted {
			if bad {
				f.scribble(scribble(regs[i]), i)
			}
		}
	}
	return nil
}

// scribble writes garbage over the host regions rs, those of key i of a get.
func (f *faulty) scribble(rs []rdma.Region, i int) {
	for _, r := range rs {
		if r.Len > 0 {
			if b := r.Bytes(); b != nil {
				fillValue(b, "storetest: scribble", uint64(i))
			}
		}
	}
}

// Get passes the call on, with faults: a key that fails by injection is not
// read, and its destination is scribbled on if FaultOptions.Scribble is set.
func (f *faulty) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	return forward(f, ctx, OpGet, keys, dst, res, f.s.Get, func(r rdma.Region) []rdma.Region { return []rdma.Region{r} })
}

// split decides the per-key faults of a batch: it writes the injected
// errors into res and returns the keys to pass on, their result slots, and
// which keys were faulted.
func (f *faulty) split(op Op, keys []string, res []store.Result, errs []error) ([]string, []store.Result, []bool) {
	faulted := make([]bool, len(keys))
	fwd := make([]string, 0, len(keys))
	for i, k := range keys {
		if err := f.keyFault(op, k, errs); err != nil {
			faulted[i] = true
			res[i] = store.Result{Err: err}
			continue
		}
		fwd = append(fwd, k)
	}
	return fwd, make([]store.Result, len(fwd)), faulted
}

// merge copies the results of the keys passed on into res.
func (f *faulty) merge(res, fres []store.Result, faulted []bool) {
	j := 0
	for i, bad := range faulted {
		if !bad {
			res[i] = fres[j]
			j++
		}
	}
}

// pick returns the entries of rs whose key was not faulted.
func pick[R any](rs []R, faulted []bool) []R {
	out := make([]R, 0, len(rs))
	for i, r := range rs {
		if !faulted[i] {
			out = append(out, r)
		}
	}
	return out
}

// Remove passes the call on, with whole-call faults.
func (f *faulty) Remove(ctx context.Context, key string) error {
	if err := f.begin(ctx, OpRemove, key); err != nil {
		return err
	}
	return f.s.Remove(ctx, key)
}

// RemovePrefix passes the call on, with whole-call faults.
func (f *faulty) RemovePrefix(ctx context.Context, prefix string) (int, error) {
	if err := f.begin(ctx, OpRemove, "prefix", prefix); err != nil {
		return 0, err
	}
	return f.s.RemovePrefix(ctx, prefix)
}

// RemoveAll passes the call on, with whole-call faults.
func (f *faulty) RemoveAll(ctx context.Context) (int, error) {
	if err := f.begin(ctx, OpRemove, "all"); err != nil {
		return 0, err
	}
	return f.s.RemoveAll(ctx)
}

// Register passes the call on.
func (f *faulty) Register(r rdma.Region) error { return f.s.Register(r) }

// Unregister passes the call on.
func (f *faulty) Unregister(r rdma.Region) error { return f.s.Unregister(r) }

// Stats returns the wrapped store's counters.
func (f *faulty) Stats() store.Stats { return f.s.Stats() }

// Close closes the wrapped store.
func (f *faulty) Close() error { return f.s.Close() }
