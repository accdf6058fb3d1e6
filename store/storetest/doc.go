// Package storetest checks implementations of [store.Store] and helps test
// the code that uses them.
//
// It is for two kinds of test. An implementation's own tests call [Run],
// a conformance harness in the spirit of testing/fstest and
// golang.org/x/net/nettest: a rapid state machine against a model, plus
// concurrency, removal, repeated-key, look-alike key, prefix, bad-input,
// registration, context and close checks. It exercises only what the
// implementation declares in [Options] (whether it evicts, how much it
// holds, whether its removals respect read leases, whether it takes only
// registered memory or device memory too, which Stats it keeps exactly)
// and the optional interfaces it implements ([store.Vectored], and
// [store.Leaser], whose declaration of the store's read leases it takes
// in place of Options.Leases and checks against what the store does), in
// seconds. Tests of higher layers (connectors, engines) wrap a store in a
// [Faulty] store, which injects whole-call errors, partial batch failures,
// keys that vanish between Exists and Get, and latency, deterministically
// for a given seed, and which implements store.Vectored and store.Leaser
// exactly when the wrapped store does.
//
// # Usage
//
// Conformance, in the implementation's package:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t testing.TB) store.Store {
//			s, err := memstore.New(memstore.Config{Capacity: 1 << 20})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		}, storetest.Options{Evicts: true, Capacity: 1 << 20, Stats: true, Counters: storetest.AllCounters})
//	}
//
// A small store evicts under the harness's fills, so that evictions meet
// the model; a store that holds twice its declared Capacity without
// evicting fails.
//
// Fault injection, in a higher layer's test:
//
//	s := storetest.NewFaulty(inner, storetest.FaultOptions{
//		Seed:       1,
//		KeyRate:    0.05, // 5% of keys fail alone
//		VanishRate: 0.1,  // 10% of present keys are evicted right after Exists
//		Scribble:   true, // failed gets leave garbage in their destinations
//	})
//	// ... run the code under test over s, then check its outputs, and
//	// s.Faults() to see that faults happened.
//
// Run moves values through host memory from [rdma.AllocHost], registered
// with each store it creates, and skips on platforms without it.
//
// # Promises and the checks that prove them
//
// Every promise of [store.Store] and its optional interfaces, and the
// subtest of [Run] that checks it:
//
//   - Put: first writer wins, across calls and within a batch; N is the
//     source's length on success, 0 beside an error; per-key
//     store.ErrInvalidKey, store.ErrInvalidRegion, store.ErrNoSpace;
//     sources neither written nor read after the call: StateMachine,
//     FirstWriterWins, RepeatedKeys, BadInput, Sizes.
//   - Get: the value's bytes exactly, from the destination's start, N its
//     size, nothing written past it; store.ErrBufferTooSmall with nothing
//     written; every occurrence of a repeated key served on its own; under
//     a concurrent removal or eviction the value whole or
//     store.ErrNotFound, never torn or another key's: StateMachine,
//     Sizes (1 byte to 4 MiB), RepeatedKeys, Churn, Removal, Reput.
//   - Exists: presence and the value's size: StateMachine, Sizes.
//   - Remove, RemovePrefix, RemoveAll: exactly the keys named, byte for
//     byte prefixes, counted exactly; a removed key never comes back
//     unless put again, and then with the new value: StateMachine,
//     Prefixes, DistinctKeys, Removal, Reput, Sizes (300 keys).
//   - Keys: up to store.MaxKeyLen bytes, case and every byte significant:
//     DistinctKeys, BadInput.
//   - Register and Unregister, and stores that take only registered
//     memory (Options.Registration) or device memory
//     (Options.DeviceMemory): Register, Registration, BadInput.
//   - Context: a done context fails a call before it starts; a call
//     canceled, or whose deadline passes, while it runs reports exactly
//     what it did, with the context's own error (context.Canceled or
//     context.DeadlineExceeded) for the keys it did not do, leaves no
//     half-written value, and the store serves calls afterwards; a store
//     honors its context between keys (unless Options.WholeBatches):
//     Context (MidBatch: batches of up to 1024 small keys; MidBatchLarge:
//     300 keys, values of up to 1 MiB).
//   - Close: idempotent, later calls fail with store.ErrClosed, calls in
//     flight finish correctly and Close waits for them, nothing writes
//     into a caller's region after Close returned: Close, CloseWhileBusy,
//     CloseWhileLarge (batches of 320 keys and values of up to 4 MiB in
//     flight from three goroutines).
//   - Capacity and eviction (Options.Capacity, Options.Evicts): nothing
//     vanishes from a store that does not evict; one that evicts does
//     under fills of twice its capacity: StateMachine, Churn.
//   - Stats (Options.Stats, Options.Counters): StateMachine.
//   - store.Vectored: Vectored, Sizes (GetV across odd cuts),
//     Context (PutV and GetV canceled mid-batch).
//   - store.Leaser: Leases (Remove, RemovePrefix and RemoveAll under
//     declared leases), StateMachine.
//   - store.Watcher: Watch; store.KeyExpired: Expiry.
//   - Expiry (Options.Expiring): a key is present, whole, while less than
//     its time to live has passed since its put started, and absent to
//     Get, Exists, mixed batches, GetV, Remove and RemovePrefix once it
//     has passed since its put returned; a put of an expired key stores
//     the new value; a store.Watcher announces each expired key once as
//     store.KeyExpired, whether or not a call asked for it: Expiry.
//
// What is not checked: a store's expiry when it cannot be configured to
// a time to live short enough to wait out (Options.Expiring takes the
// time to live from Run); Stats().Keys and Bytes of a store whose keys
// expire; cancellation of a store that declares Options.WholeBatches
// between the keys of one backend call, which such a store cannot do.
//
// # Concurrency
//
// Run calls newStore from its subtests' goroutines, one store at a time per
// subtest, and drives some stores from several goroutines at once (which
// is how it finds races under -race). A [Faulty] store is safe for
// concurrent use if the store it wraps is.
package storetest
