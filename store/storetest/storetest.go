package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// Options declares what the store under test does, so that [Run] checks
// exactly that and nothing it does not claim. The zero Options declares a
// store that holds 1 MiB without dropping a key on its own, takes any
// valid host region, grants no read leases and keeps no counter exactly;
// each field says what Run checks with it and without it.
type Options struct {
	// Evicts declares that the store may drop keys on its own to make room,
	// as a cache does. Run then accepts a key vanishing (and a put refused
	// with store.ErrNoSpace) at any time, except while a Get copies the
	// key's value, and stores several times Capacity to cause evictions.
	// Its state machine stores twice Capacity in values of MaxValueSize
	// bytes (under at most 1024 keys of its own) beside the keys it
	// models, so that the model sees its keys evicted: a key the store
	// reported absent must not come back unless put again, and a get after
	// an exists found a key returns its value or store.ErrNotFound. It
	// fails when no check saw a key evicted or a put refused: declare the
	// capacity the store has. Without Evicts, every key stays until
	// removed.
	Evicts bool

	// Capacity is the number of value bytes the store holds without
	// evicting or refusing a put. Without Evicts, Run fails a put refused
	// with store.ErrNoSpace while the values it stored stay within
	// Capacity. With Evicts, Run sizes its fills by it (see Evicts): a
	// store that holds twice Capacity or more without evicting fails.
	// Zero means 1 MiB.
	Capacity int64

	// MaxValueSize is the size in bytes of the largest value Run stores.
	// Zero means 4096.
	MaxValueSize int

	// Stats declares that Stats().Keys and Stats().Bytes count the keys
	// and value bytes the store holds, exactly, whenever no call is in
	// flight. Run then checks them after every step of its state machine.
	Stats bool

	// Counters declares the cumulative counters of store.Stats that the
	// store keeps exactly (see Counter for what each counts). Run checks
	// each after every step of its state machine against the results of
	// the calls it made. A store whose counters are all zero declares
	// none.
	Counters Counter

	// Leases declares that the store grants read leases and that its
	// removals respect them, as store/mooncake does: Remove of a key under
	// a lease may fail with an error matching store.ErrHasLease, the key
	// staying whole, and RemovePrefix and RemoveAll may leave such keys,
	// counting only what they removed (with a nil error or one matching
	// store.ErrHasLease). Run then accepts those outcomes, and after a
	// removal that left keys it learns from the next calls which ones.
	// Without Leases, every removal removes what it names.
	//
	// A store that implements store.Leaser declares its leases itself,
	// and Run takes them from there, checking them against what the store
	// does (see Run's Leases subtest): Leases is then read as set when the
	// store's Leases grant any (Exists or Get), and must not be set when
	// they grant none. Leave it false for such a store.
	Leases bool

	// Registration declares that the store, like Mooncake Store, takes
	// only memory inside a region given to Register: Put and Get refuse
	// any other region with store.ErrInvalidRegion for its key. Run then
	// checks that they refuse regions outside registered memory, and
	// regions that start before a registered one or end after it, storing
	// and writing nothing for those keys. Without Registration, Run checks
	// that the store accepts any valid host region, registered or not, as
	// store.Store.Register says.
	Registration bool

	// DeviceMemory declares that the store takes device regions
	// (rdma.Device) as sources and destinations. Run has no device memory
	// to check them with. Without DeviceMemory, it checks that the store
	// refuses device regions, in Register and per key in Put and Get (with
	// store.ErrInvalidRegion), reading and writing nothing through them.
	DeviceMemory bool

	// WholeBatches declares that the store runs each batch call as one
	// request to its backend once it has looked at the call's context, and
	// cannot stop it part way, as store/mooncake does (one
	// batch_put_from, batch_get_into or batch_is_exist call per batch):
	// store.Store asks a store to honor cancellation between keys. Run's
	// MidBatchLarge subtest then accepts a batch whose context ended right
	// after the store's first look, and which did every key without
	// looking again; every other check of cancellation holds. Without
	// WholeBatches, such a batch fails: the store ran detached.
	WholeBatches bool

	// Expiring declares that the store's keys can expire: it returns a
	// store like those newStore returns, but for its keys, which each
	// expire ttl after the put that stored it (a read does not extend
	// it). Run's Expiry subtest calls it with a ttl short enough to wait
	// out (a fraction of a second), and checks that keys are present,
	// whole, while the harness measured less than ttl since their put
	// started, and absent once ttl has passed since their put returned:
	// to Get (nothing written), Exists, batches that mix them with
	// present keys, GetV, Remove (store.ErrNotFound) and RemovePrefix
	// (not counted); that a put of an expired key stores the new value;
	// and, from a store that implements store.Watcher, that each expired
	// key is announced once, as store.KeyExpired, whether or not a call
	// asked for it. The stores newStore returns must keep their keys for
	// the whole run (no expiry, or one of hours), as every other subtest
	// assumes. Nil declares a store whose keys do not expire, and skips
	// Expiry.
	Expiring func(t testing.TB, ttl time.Duration) store.Store
}

func (o *Options) ensureDefaults() error {
	if o.Capacity == 0 {
		o.Capacity = 1 << 20
	}
	if o.MaxValueSize == 0 {
		o.MaxValueSize = 4096
	}
	switch {
	case o.Capacity < 0:
		return fmt.Errorf("storetest: Options.Capacity %d: must not be negative", o.Capacity)
	case o.MaxValueSize < 2:
		return fmt.Errorf("storetest: Options.MaxValueSize %d: must be at least 2", o.MaxValueSize)
	case o.Counters&^AllCounters != 0:
		return fmt.Errorf("storetest: Options.Counters %v: unknown counters", o.Counters)
	case int64(o.MaxValueSize) > o.Capacity:
		return fmt.Errorf("storetest: Options.MaxValueSize %d: larger than Options.Capacity %d", o.MaxValueSize, o.Capacity)
	}
	return nil
}

// Run checks that the stores newStore returns implement [store.Store]
// correctly, as far as opts declares what they do. It runs these subtests,
// each with stores of its own:
//
//   - StateMachine: a rapid state machine of batch puts, gets and exists,
//     lookups (an exists, then a get of the keys found), removes, prefix
//     removes and remove-alls, and, in a store that evicts, fills of twice
//     its capacity that make it evict keys of the model, checked against a model
//     after every step: a present value always has exactly its first-written
//     bytes, a removed key never comes back, a key vanishes only if the
//     store evicts, gets write exactly the value's bytes and nothing past
//     them, puts neither write their sources nor keep reading them, every
//     result's N is what store.Result says (the value's size for Exists
//     and Get, the source's length for every successful put, a put of a
//     present key included, 0 beside every error); and the Stats counters
//     the store declares (Options.Stats, Options.Counters) read what the
//     calls' results say.
//   - FirstWriterWins: concurrent puts of different values under the same
//     keys, with concurrent readers: every reader sees one winner per key.
//   - Churn: concurrent puts, gets, exists and removes under eviction
//     pressure (when the store evicts): every value read is exact.
//   - RepeatedKeys: a key named more than once in one batch: a put keeps
//     the first occurrence's bytes and every occurrence succeeds, with N
//     the length of its own source; a get
//     fills every occurrence's destination, each judged on its own size.
//   - Sizes: values of 1 byte to 4 MiB + 3 (as Options.Capacity allows),
//     each stored alone, read back exactly into destinations of their
//     size and larger, across regions cut at odd offsets (store.Vectored),
//     refused into one byte too few; and put, exists, get and RemovePrefix
//     of 300 keys in single calls. Values are a keyed hash of key and
//     position, so a misplaced part never matches.
//   - DistinctKeys: keys of store.MaxKeyLen bytes that differ in one byte,
//     keys that are prefixes of each other, keys that differ in case only:
//     each holds its own value, and removing one leaves the others.
//   - Prefixes: RemovePrefix of prefixes holding the metacharacters of
//     regular expressions and glob patterns (. * [ + ? \ $ ^ ( | {), and
//     of prefixes of each other, over keys that start with them and keys
//     that such a pattern would match: exactly the keys that start with
//     the prefix, byte for byte, are removed and counted.
//   - Removal: gets running while Remove, RemovePrefix and RemoveAll take
//     their keys away and puts store other keys' values of the same size
//     in the space freed: every get returns its key's value whole or
//     reports it absent, never a torn value or another key's bytes.
//   - Reput: one key removed and put again with a new value of a new
//     size, alone (each get returns the latest value, or nothing after a
//     remove) and beside readers (each get returns one of the key's
//     values whole; the last, the writer's last).
//   - Leases, when the store implements store.Leaser: what its Leases
//     declares, checked against what its removals do right after an
//     Exists and after a Get of a key: a call declared to grant no lease,
//     or leases that end with their call (TTL 0), leave Remove and
//     RemovePrefix free to take the key; one declared to grant a lease of
//     TTL makes Remove fail with store.ErrHasLease within RemoveWait (and
//     some slack) and RemovePrefix leave the key, until TTL has passed,
//     the key staying whole; and a TTL short enough to wait out (at most
//     2 s) ends by then. RemoveAll, in a store of its own, is held to the
//     same as RemovePrefix. A store that implements store.Leaser also sets
//     what Options.Leases would (see there), and one whose leases end
//     with their call is held to removals that take every key they name
//     in the state machine, where no call is in flight beside a removal.
//   - Expiry, when Options.Expiring is set: see there.
//   - Watch, when the store implements store.Watcher: Watch refuses a
//     buffer outside [1, store.MaxWatch]; each key Remove, RemovePrefix
//     and RemoveAll take is announced gone once (KeyRemoved; KeyEvicted
//     too from a store that evicts), to every open feed, and no key that
//     was not there; KeyStored only for keys put, before they leave; a
//     full feed holds its buffer, drops and counts the rest (Take's lost
//     and Dropped agree); a closed feed gets nothing; Watch after Close
//     fails with store.ErrClosed.
//   - Vectored, when the store implements store.Vectored: PutV and GetV
//     against the same values as Put and Get, across regions of random
//     sizes, with short region lists, empty ones and repeated keys (the
//     state machine then also puts and gets through them).
//   - BadInput: invalid keys, empty and zero regions (and device regions,
//     without Options.DeviceMemory), short destinations
//     and batch slices of different lengths get per-key errors (or the
//     whole-call error for slices) and change nothing.
//   - Register: overlapping regions (around, inside, across the start or
//     the end of a registered one), unknown regions and, without
//     Options.DeviceMemory, device regions are refused.
//   - Registration: puts from and gets into regions outside registered
//     memory, across the start or the end of a registered region, or
//     around it, are refused per key with store.ErrInvalidRegion when the
//     store declares Options.Registration, and served otherwise.
//   - Context: a context canceled, or whose deadline has passed, before
//     the call fails every call that takes one as a whole with the
//     context's error, and they do nothing. Batch calls (and RemovePrefix
//     and RemoveAll) canceled while they run, at the store's first look at
//     the context, at a later one, or from another goroutine, may have
//     done some keys: whenever the cancellation arrives, a key reported
//     done was done exactly, a key not done reports the context's error
//     (never success, nor store.ErrNotFound for a key that is present),
//     and a removal counts exactly the keys it took. MidBatchLarge does
//     the same with batches of 300 keys holding values of up to 1 MiB,
//     canceled and past deadlines (context.DeadlineExceeded, at a look, from
//     another goroutine, by the clock), then checks that the store still
//     serves a put and a get, and that a batch whose context ended right
//     after the store's first look did not do every key without looking
//     again (unless Options.WholeBatches).
//   - Close and CloseWhileBusy: calls after Close fail with store.ErrClosed,
//     Close is idempotent, and calls in flight when Close starts finish
//     with correct results.
//   - CloseWhileLarge: Close while three goroutines call with batches of
//     320 keys and values of up to 4 MiB (as Options.Capacity allows):
//     Close returns, every call returns nil or store.ErrClosed, a get
//     reports only whole values, and no call writes into its destinations
//     after Close returned (the harness overwrites the destinations of
//     the gets still in flight then, and checks them when they return).
//
// newStore is called once per store, from the subtest's goroutine (or the
// rapid check's), with the subtest as t; and once before the subtests,
// with t, for a store that Run asks for its store.Leaser declaration and
// closes at once (every store must declare the same leases). Run
// registers the host memory it uses with each store, unregisters it at
// the end, and closes every store it creates; stores must tolerate a
// second Close. Failures name the operation,
// the keys and what was expected. The state machine honors rapid's flags
// (-rapid.checks, -rapid.steps, -rapid.seed) and -short shortens every
// subtest.
//
// Run needs host memory from [rdma.AllocHost] and skips where that is not
// supported.
func Run(t *testing.T, newStore func(t testing.TB) store.Store, opts Options) {
	t.Helper()
	run(tt{t}, newStore, opts, "")
}

// tester is the part of a test that Run uses: testing.TB and subtests. Run
// takes a *testing.T; the package's own tests pass a recorder that runs the
// same subtests against stores that are broken on purpose.
type tester interface {
	testing.TB
	run(name string, f func(t tester)) bool
}

// tt adapts *testing.T to tester.
type tt struct{ *testing.T }

func (t tt) run(name string, f func(t tester)) bool {
	return t.T.Run(name, func(t *testing.T) { f(tt{t}) })
}

// run runs Run's subtests, or only the one named only if it is not "".
func run(t tester, newStore func(t testing.TB) store.Store, opts Options, only string) {
	t.Helper()
	if err := opts.ensureDefaults(); err != nil {
		t.Fatal(err)
	}
	probe, err := rdma.AllocHost(1)
	if errors.Is(err, rdma.ErrUnsupported) {
		t.Skipf("storetest: needs host memory: %v", err)
	}
	if err != nil {
		t.Fatalf("storetest: %v", err)
	}
	if err := probe.Free(); err != nil {
		t.Fatalf("storetest: %v", err)
	}
	h := &harness{newStore: newStore, opts: opts}
	h.declared(t)
	for _, sub := range h.subtests() {
		if only == "" || sub.name == only {
			t.run(sub.name, sub.f)
		}
	}
}

// subtests are Run's subtests, in order.
func (h *harness) subtests() []struct {
	name string
	f    func(tester)
} {
	return []struct {
		name string
		f    func(tester)
	}{
		{"StateMachine", h.stateMachine},
		{"FirstWriterWins", h.firstWriterWins},
		{"Churn", h.churn},
		{"RepeatedKeys", h.repeatedKeys},
		{"Sizes", h.sizes},
		{"DistinctKeys", h.distinct},
		{"Prefixes", h.prefixes},
		{"Removal", h.removal},
		{"Reput", h.reput},
		{"Leases", h.leases},
		{"Expiry", h.expiry},
		{"Watch", h.watch},
		{"Vectored", h.vectored},
		{"BadInput", h.badInput},
		{"Register", h.register},
		{"Registration", h.registration},
		{"Context", h.context},
		{"Close", h.close},
		{"CloseWhileBusy", h.closeWhileBusy},
		{"CloseWhileLarge", h.closeLarge},
	}
}

// harness carries what every subtest needs.
type harness struct {
	newStore func(t testing.TB) store.Store
	opts     Options
	// lease is what the stores declare through store.Leaser, if leaser.
	lease  store.Leases
	leaser bool
}

// open returns a new store with mem registered, to be unregistered and
// closed when t ends.
func (h *harness) open(t tester, mems ...*memory) store.Store {
	t.Helper()
	return h.openWith(t, h.newStore, mems...)
}

// openWith is open, with a store from newStore.
func (h *harness) openWith(t tester, newStore func(testing.TB) store.Store, mems ...*memory) store.Store {
	t.Helper()
	s := newStore(t)
	if s == nil {
		t.Fatal("storetest: newStore returned a nil store")
	}
	if err := h.sameLeases(s); err != nil {
		closeStore(t, s)
		t.Fatal(err)
	}
	for _, m := range mems {
		if err := s.Register(m.region()); err != nil {
			closeStore(t, s)
			t.Fatalf("Register(%v) = %v, want nil", m.region(), err)
		}
	}
	t.Cleanup(func() {
		for _, m := range mems {
			if err := s.Unregister(m.region()); err != nil && !errors.Is(err, store.ErrClosed) {
				t.Errorf("Unregister(%v) = %v, want nil", m.region(), err)
			}
		}
		closeStore(t, s)
	})
	return s
}

func closeStore(t testing.TB, s store.Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Errorf("Close() = %v, want nil", err)
	}
}

// waitBound is how long Run waits for the goroutines of a concurrent
// subtest: generous, as the machine may be slow or busy; only a call that
// hangs takes that long.
var waitBound = time.Minute

// wait waits for wg, what it waits for, at most waitBound. Past it, the
// test ends by a panic naming what it waited for: the goroutines still
// call the store and use memory that the test's cleanups would free, so
// the test cannot fail and go on.
func wait(t testing.TB, what string, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	timer := time.NewTimer(waitBound)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Errorf("storetest: %s: not done after %v; a call into the store hangs", what, waitBound)
		panic(fmt.Sprintf("storetest: %s: %s: not done after %v; a call into the store hangs", t.Name(), what, waitBound))
	}
}

// short reports whether the test runs with -short.
func short() bool { return testing.Short() }

var background = context.Background()
