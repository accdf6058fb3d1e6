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
// # Concurrency
//
// Run calls newStore from its subtests' goroutines, one store at a time per
// subtest, and drives some stores from several goroutines at once (which
// is how it finds races under -race). A [Faulty] store is safe for
// concurrent use if the store it wraps is.
package storetest
