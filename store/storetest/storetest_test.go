package storetest

import (
	"flag"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/internal/tbrecord"
	"github.com/kvconnect/kvconnect/store"
)

// recorder is a tester that records failures instead of failing the test
// it runs in (internal/tbrecord), so that the harness can be run against
// broken stores.
type recorder struct{ *tbrecord.Recorder }

func newRecorder(t testing.TB, name string) recorder { return recorder{tbrecord.New(t, name)} }

func (r recorder) run(name string, f func(t tester)) bool {
	return r.Recorder.Run(name, func(c *tbrecord.Recorder) { f(recorder{c}) })
}

// runRecorded runs the harness against the stores newStore returns, under
// a recorder, and returns what it recorded. With only, it runs only the
// subtest of that name (the first element of a name such as
// "BadInput/Keys").
func runRecorded(t *testing.T, newStore func(testing.TB) store.Store, opts Options, only ...string) *tbrecord.Recording {
	r := newRecorder(t, "Run")
	sub := ""
	if len(only) > 0 {
		sub, _, _ = strings.Cut(only[0], "/")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer r.RunCleanups()
		run(r, newStore, opts, sub)
	}()
	<-done
	return r.Recording()
}

// fastRapid shortens rapid's shrinking for tests that expect a failure.
func fastRapid(t *testing.T) {
	f := flag.Lookup("rapid.shrinktime")
	old := f.Value.String()
	if err := f.Value.Set("250ms"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Value.Set(old); err != nil {
			t.Error(err)
		}
	})
	t.Chdir(t.TempDir()) // rapid writes fail files under ./testdata
}

// watchBug reports whether b is a bug of a store that implements
// store.Watcher.
func watchBug(b bug) bool {
	switch b {
	case bugWatchMissesPrefix, bugWatchAbsent, bugWatchTwice, bugWatchAfterClose:
		return true
	}
	return false
}

// TestRunWatcher runs the harness on correct stores that implement
// store.Watcher, evicting or not: it must pass, the Watch subtest
// included.
func TestRunWatcher(t *testing.T) {
	for _, opts := range []Options{{Capacity: 256 << 10, MaxValueSize: 2048}, {Evicts: true, Capacity: 64 << 10, MaxValueSize: 2048}} {
		got := runRecorded(t, func(testing.TB) store.Store {
			s := newRefStore(noBug, 0)
			if opts.Evicts {
				s = newRefStore(noBug, int(opts.Capacity))
			}
			s.feeds = new(store.Feeds)
			return s.store()
		}, opts)
		if failed := got.FailedUnder("Run"); len(failed) > 0 {
			t.Errorf("Run (Evicts %v) failed %v for a correct store that implements store.Watcher; it recorded:\n%s", opts.Evicts, failed, got)
		}
		if got.SaidUnder("Run/Watch", "does not implement store.Watcher") {
			t.Errorf("Run skipped Watch for a store that implements store.Watcher; it recorded:\n%s", got)
		}
	}
}

// TestRunCatchesBrokenStores runs the harness against stores with one
// deliberate bug each and checks that it fails, in the subtest that owns
// that kind of bug.
func TestRunCatchesBrokenStores(t *testing.T) {
	fastRapid(t)
	for _, tc := range brokenStores {
		t.Run(tc.name, tc.run)
	}
}

// brokenStores are the stores Run must fail, each with one bug.
var brokenStores = []brokenCase{
	{"ServesAfterRemove", bugServesAfterRemove, "StateMachine", "", Options{}},
	{"LastWriterWins", bugLastWriterWins, "StateMachine", "", Options{}},
	{"LastWriterWinsConcurrently", bugLastWriterWins, "FirstWriterWins", "", Options{}},
	{"EvictsDuringRead", bugEvictsDuringRead, "StateMachine", "", Options{Evicts: true}},
	{"EvictsDuringReadConcurrently", bugEvictsDuringRead, "Churn", "", Options{Evicts: true}},
	{"AcceptsSpaces", bugAcceptsSpaces, "BadInput/Keys", "", Options{}},
	{"IgnoresMismatch", bugIgnoresMismatch, "BadInput/Mismatch", "", Options{}},
	{"WritesShortBuffer", bugWritesShortBuffer, "BadInput/ShortDestination", "", Options{}},
	{"WritesShortBufferModel", bugWritesShortBuffer, "StateMachine", "", Options{}},
	{"VanishesWithoutEviction", bugVanishes, "StateMachine", "", Options{}},
	{"OpenAfterClose", bugOpenAfterClose, "Close", "", Options{}},
	{"OpenAfterCloseWhileBusy", bugOpenAfterClose, "CloseWhileBusy", "", Options{}},
	{"OpenAfterCloseWhileLarge", bugOpenAfterClose, "CloseWhileLarge", "after Close returned", Options{}}, // a call that succeeds, or a get that writes, after Close returned: whichever comes first
	{"CloseDetached", bugCloseDetached, "CloseWhileLarge", "written after Close returned: Close must wait for the calls in flight", Options{}},
	{"PrefixMiscount", bugPrefixMiscount, "StateMachine", "", Options{}},
	{"IgnoresContext", bugIgnoresContext, "Context/Canceled", "with a canceled context", Options{}},
	{"IgnoresDeadline", bugIgnoresDeadline, "Context/Deadline", "with a deadline an hour past", Options{}},
	{"CancelClaimsSuccessPut", bugCancelClaimsSuccess, "Context/MidBatch/Put", "claimed success for a key the batch did not store", Options{}},
	{"CancelClaimsSuccessGet", bugCancelClaimsSuccess, "Context/MidBatch/Get", "claimed success for a key the batch did not read", Options{}},
	{"CancelClaimsSuccessExists", bugCancelClaimsSuccess, "Context/MidBatch/Exists", "claimed a key the batch did not probe", Options{}},
	{"CancelAsMissGet", bugCancelAsMiss, "Context/MidBatch/Get", "but the key is present", Options{}},
	{"CancelAsMissExists", bugCancelAsMiss, "Context/MidBatch/Exists", "but the key is present", Options{}},
	{"ContextOnlyAtStartPut", bugCtxOnlyAtStart, "Context/MidBatchLarge/Put", "never looked at its context again: the store looked at it once and then ran detached", Options{Capacity: 8 << 20}},
	{"ContextOnlyAtStartGet", bugCtxOnlyAtStart, "Context/MidBatchLarge/Get", "never looked at its context again: the store looked at it once and then ran detached", Options{Capacity: 8 << 20}},
	{"ContextOnlyAtStartExists", bugCtxOnlyAtStart, "Context/MidBatchLarge/Exists", "never looked at its context again: the store looked at it once and then ran detached", Options{Capacity: 8 << 20}},
	{"CancelMiscountsPrefix", bugCancelMiscounts, "Context/MidBatch/RemovePrefix", "the count must be the keys it took", Options{}},
	{"CancelMiscountsAll", bugCancelMiscounts, "Context/MidBatch/RemoveAll", "the count must be the keys it took", Options{}},
	{"AcceptsDevice", bugAcceptsDevice, "BadInput/Regions", "a device region", Options{}},
	{"AcceptsDeviceRegister", bugAcceptsDevice, "Register", "of a device region", Options{}},
	{"RegisterMissesStart", bugRegisterMissesStart, "Register", "starts before a registered one and ends inside it", Options{}},
	{"RegisteredStartOnly", bugRegisteredStartOnly, "Registration", "starts inside the registered one and ends after it", Options{Registration: true}},
	{"RegisteredEndOnly", bugRegisteredEndOnly, "Registration", "starts before the registered one and ends inside it", Options{Registration: true}},
	{"RequiresRegistration", bugRequiresRegistration, "Registration", "accepts any valid host region", Options{}},
	{"CountsShortAsHit", bugCountsShortAsHit, "StateMachine", "Stats().Hits", Options{Counters: AllCounters}},
	{"CountsShortAsMiss", bugCountsShortAsMiss, "StateMachine", "Stats().Misses", Options{Counters: AllCounters}},
	{"CountsRoomAsBytesOut", bugCountsRoomAsBytesOut, "StateMachine", "Stats().BytesOut", Options{Counters: AllCounters}},
	{"CountsFoundExists", bugCountsFoundExists, "StateMachine", "Stats().Exists", Options{Counters: AllCounters}},
	{"CountsPresentAsPut", bugCountsPresentAsPut, "StateMachine", "Stats().Puts", Options{Counters: CounterPuts}},
	{"CountsPresentAsPutDuplicates", bugCountsPresentAsPut, "StateMachine", "Stats().Duplicates", Options{Counters: CounterDuplicates}},
	{"MissesRepeatDuplicate", bugMissesRepeatDuplicate, "StateMachine", "Stats().Duplicates", Options{Counters: CounterDuplicates}},
	{"CountsDuplicateBytesIn", bugCountsDuplicateBytesIn, "StateMachine", "Stats().BytesIn", Options{Counters: CounterBytesIn}},
	{"CountsPresentAsRejected", bugCountsPresentAsRejected, "StateMachine", "Stats().RejectedPuts", Options{Counters: CounterRejectedPuts}},
	{"StaleAfterEviction", bugStaleAfterEviction, "StateMachine", "a stale entry", Options{Evicts: true}},
	{"EvictedAliases", bugEvictedAliases, "StateMachine", "", Options{Evicts: true}},
	{"NeverCountsEvictions", bugNeverCountsEvictions, "StateMachine", "Stats().Evictions", Options{Evicts: true, Counters: CounterEvictions}},
	{"NeverEvicts", bugNeverEvicts, "StateMachine", "none saw a key evicted", Options{Evicts: true}},
	{"DuplicateHeldSize", bugDuplicateHeldSize, "StateMachine", "the size of the value the key holds", Options{}},
	{"DuplicateHeldSizeRepeat", bugDuplicateHeldSize, "RepeatedKeys", "its own source's length", Options{}},
	{"DuplicateZero", bugDuplicateZero, "StateMachine", "although it stores nothing then", Options{}},
	{"ShortReportsSize", bugShortReportsSize, "StateMachine", "N is 0 whenever Err is set", Options{}},
	{"RetainsSource", bugRetainsSource, "StateMachine", "", Options{}},
	{"WritesPastValue", bugWritesPastValue, "StateMachine", "", Options{}},
	{"StatsOffByOne", bugStatsOffByOne, "StateMachine", "", Options{Stats: true}},
	{"RepeatLastWins", bugRepeatLastWins, "RepeatedKeys", "first writer wins within a batch", Options{}},
	{"WrapsPastMiB", bugWrapsPastMiB, "Sizes/Values", "byte 1048576 of the 1048577-byte value", Options{Capacity: 8 << 20}},
	{"BatchCap256", bugBatchCap256, "Sizes/Batch", "key 256", Options{}},
	{"ReputRevives", bugReputRevives, "Reput", "a put after a remove stores the new value", Options{}},
	{"WatchMissesPrefix", bugWatchMissesPrefix, "Watch", "was removed, but no event says it is gone", Options{}},
	{"WatchAbsent", bugWatchAbsent, "Watch", "a key never put", Options{}},
	{"WatchTwice", bugWatchTwice, "Watch", "a key leaves once", Options{}},
	{"WatchAfterClose", bugWatchAfterClose, "Watch", "Watch(16) after Close", Options{}},
	{"RepeatLastWinsModel", bugRepeatLastWins, "StateMachine", "", Options{}},
	{"RepeatFillsLast", bugRepeatFillsLast, "RepeatedKeys", "fills every occurrence's destination", Options{}},
	{"RepeatFillsLastModel", bugRepeatFillsLast, "StateMachine", "", Options{}},
	{"TornUnderRemoval", bugTornUnderRemoval, "Removal", "a torn value", Options{}},
	{"ForeignUnderRemoval", bugForeignUnderRemoval, "Removal", "another key's bytes", Options{}},
	{"ForeignUnderRemovalLeases", bugForeignUnderRemoval, "Removal", "another key's bytes", Options{Leases: true}},
	{"LeaseRefusalLies", bugLeaseRefusalLies, "StateMachine", "vanished", Options{Leases: true}},
	{"UndeclaredLeasesExists", bugUndeclaredLeases, "Leases/Exists", "declares no read leases, so Exists does not grant one", Options{}},
	{"UndeclaredLeasesGet", bugUndeclaredLeases, "Leases/Get", "declares no read leases, so Get does not grant one", Options{}},
	{"UndeclaredLeasesPrefix", bugUndeclaredLeases, "Leases/RemovePrefix", "want a nil error: store.Leaser declares no read leases", Options{}},
	{"UndeclaredLeasesModel", bugUndeclaredLeases, "StateMachine", "", Options{}},
	{"UnheldLeasesExists", bugUnheldLeases, "Leases/Exists", "the key must stay until the lease ends", Options{}},
	{"UnheldLeasesGet", bugUnheldLeases, "Leases/Get", "the key must stay until the lease ends", Options{}},
	{"UnheldLeasesPrefix", bugUnheldLeases, "Leases/RemovePrefix", "under a lease, must stay and not be counted", Options{}},
	{"RemoveAllIgnoresLeases", bugRemoveAllIgnoresLeases, "Leases/RemoveAll", "under a lease, must stay and not be counted", Options{}},
	{"LeaseOutlivesTTL", bugLeaseOutlivesTTL, "Leases/Exists", "the lease outlived its TTL", Options{}},
	{"TruncatesKeys", bugTruncatesKeys, "DistinctKeys", "conflates keys that differ", Options{}},
	{"TruncatesKeysModel", bugTruncatesKeys, "StateMachine", "", Options{}},
	{"FoldsCase", bugFoldsCase, "DistinctKeys", "in case only", Options{}},
	{"FoldsCaseModel", bugFoldsCase, "StateMachine", "", Options{}},
	{"PrefixRegex", bugPrefixRegex, "Prefixes", "which does not start with it", Options{}},
	{"PrefixRegexLeft", bugPrefixRegex, "Prefixes/Dollar", "which starts with it", Options{}},
	{"PrefixGlob", bugPrefixGlob, "Prefixes/Star", "which does not start with it", Options{}},
	{"PrefixContains", bugPrefixContains, "Prefixes/PrefixOfOthers", "which does not start with it", Options{}},
	{"PrefixRegexEvicting", bugPrefixRegex, "Prefixes/Dot", "which does not start with it", Options{Evicts: true, Counters: CounterEvictions}},
}

// brokenCase is a store with one bug, what it declares, and where and why
// Run must fail for it.
type brokenCase struct {
	name   string
	bug    bug
	caught string  // the subtest that must fail, under Run/
	reason string  // what its failure must say, if anything in particular
	opts   Options // what the store declares; Capacity and MaxValueSize default to 256 KiB and 2 KiB
}

// run runs the harness on refStores with the bug, evicting at
// Options.Capacity when they declare Evicts (but for bugNeverEvicts),
// and checks that it fails in
// tc.caught, saying tc.reason.
func (tc brokenCase) run(t *testing.T) {
	opts := tc.opts
	if opts.Capacity == 0 {
		opts.Capacity = 256 << 10
	}
	if opts.MaxValueSize == 0 {
		opts.MaxValueSize = 2048
	}
	capacity := 0
	if opts.Evicts && tc.bug != bugNeverEvicts {
		capacity = int(opts.Capacity)
	}
	got := runRecorded(t, func(testing.TB) store.Store {
		s := newRefStore(tc.bug, capacity)
		s.needsReg = opts.Registration
		if watchBug(tc.bug) {
			s.feeds = new(store.Feeds)
		}
		return s.store()
	}, opts, tc.caught)
	if failed := got.FailedUnder("Run/" + tc.caught); len(failed) == 0 {
		t.Errorf("Run did not fail in %s for a store with bug %s; it recorded:\n%s", tc.caught, tc.name, got)
	} else if !got.SaidUnder("Run/"+tc.caught, tc.reason) {
		t.Errorf("Run failed in %s for a store with bug %s, but never said %q; it recorded:\n%s", failed, tc.name, tc.reason, got)
	}
}

// TestRunCatchesBrokenVectored runs the harness against stores whose PutV
// or GetV has one deliberate bug each, and checks that it fails where it
// should, saying why.
func TestRunCatchesBrokenVectored(t *testing.T) {
	fastRapid(t)
	for _, tc := range []struct {
		name   string
		bug    vbug
		caught string // a subtest that must fail, under Run/
		reason string
	}{
		{"Reversed", vbugReversed, "Vectored", "do not hold its value, in order"},
		{"ReversedModel", vbugReversed, "StateMachine", ""},
		{"WritesTooSmall", vbugWritesTooSmall, "Vectored", "nothing may be written"},
		{"WritesTooSmallModel", vbugWritesTooSmall, "StateMachine", ""},
		{"EmptyIsValue", vbugEmptyIsValue, "Vectored", "want store.ErrInvalidRegion"},
		{"FirstRegionOnly", vbugFirstRegionOnly, "Vectored", "do not hold its value"},
		{"Contiguous", vbugContiguous, "Vectored", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{Capacity: 256 << 10, MaxValueSize: 2048}
			got := runRecorded(t, func(testing.TB) store.Store { return newVecStore(tc.bug) }, opts, tc.caught)
			if failed := got.FailedUnder("Run/" + tc.caught); len(failed) == 0 {
				t.Errorf("Run did not fail in %s for a Vectored store with bug %s; it recorded:\n%s", tc.caught, tc.name, got)
			} else if !got.SaidUnder("Run/"+tc.caught, tc.reason) {
				t.Errorf("Run failed in %s for a Vectored store with bug %s, but never said %q; it recorded:\n%s", failed, tc.name, tc.reason, got)
			}
		})
	}
}

// TestRunPassesCorrectStores runs the harness, under a recorder and for
// real, against the correct reference store: without eviction, with
// eviction, and through a Faulty wrapper that injects nothing.
func TestRunPassesCorrectStores(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity int
		opts     Options
		wrap     bool
	}{
		{"Plain", 0, Options{Capacity: 256 << 10, MaxValueSize: 2048, Stats: true, Counters: AllCounters}, false},
		{"Evicting", 64 << 10, Options{Evicts: true, Capacity: 64 << 10, MaxValueSize: 2048, Stats: true, Counters: AllCounters}, false},
		{"FaultyWithoutFaults", 0, Options{Capacity: 256 << 10, MaxValueSize: 2048, Stats: true, Counters: AllCounters}, true},
		{"Registration", -2, Options{Capacity: 256 << 10, MaxValueSize: 2048, Stats: true, Registration: true}, false},
		{"Vectored", -1, Options{Capacity: 256 << 10, MaxValueSize: 2048, Stats: true, Counters: AllCounters}, false},
		{"FaultyVectoredWithoutFaults", -1, Options{Capacity: 256 << 10, MaxValueSize: 2048, Stats: true, Counters: AllCounters}, true},
		{"LongLeases", -3, Options{Capacity: 256 << 10, MaxValueSize: 2048, Stats: true, Counters: AllCounters}, false},
		{"ShortLeases", -4, Options{Capacity: 256 << 10, MaxValueSize: 2048, Stats: true, Counters: AllCounters}, false},
		{"GetLeasesOnly", -5, Options{Capacity: 256 << 10, MaxValueSize: 2048, Stats: true, Counters: AllCounters}, false},
		{"NoLeases", -6, Options{Capacity: 256 << 10, MaxValueSize: 2048, Stats: true, Counters: AllCounters}, false},
		{"FaultyLeasesWithoutFaults", -3, Options{Capacity: 256 << 10, MaxValueSize: 2048, Stats: true, Counters: AllCounters}, true},
	} {
		newStore := func(testing.TB) store.Store {
			var s store.Store
			switch tc.capacity {
			case -1: // the reference store with PutV and GetV
				s = newVecStore(noVBug)
			case -2: // the reference store that takes registered memory only
				r := newRefStore(noBug, 0)
				r.needsReg = true
				s = r
			case -3: // leases of an hour on Exists and Get, declared
				s = newLeasingStore(store.Leases{Exists: true, Get: true, TTL: time.Hour})
			case -4: // leases of 50 ms on Exists and Get, declared
				s = newLeasingStore(store.Leases{Exists: true, Get: true, TTL: 50 * time.Millisecond})
			case -5: // leases of an hour on Get only, declared
				s = newLeasingStore(store.Leases{Get: true, TTL: time.Hour})
			case -6: // no leases, declared
				s = newLeasingStore(store.Leases{})
			default:
				s = newRefStore(noBug, tc.capacity)
			}
			if tc.wrap {
				s = NewFaulty(s, FaultOptions{Seed: 1})
			}
			return s
		}
		t.Run(tc.name, func(t *testing.T) {
			if got := runRecorded(t, newStore, tc.opts); len(got.FailedUnder("")) > 0 {
				t.Errorf("Run under a recorder failed %v for a correct store:\n%s", got.FailedUnder(""), got)
			}
			Run(t, newStore, tc.opts)
		})
	}
}

// newLeasingStore returns a correct refStore that grants the leases l
// and declares them.
func newLeasingStore(l store.Leases) store.Store {
	s := newRefStore(noBug, 0)
	s.grants, s.declares = l, &l
	return s.store()
}

// TestRunRefusesContradictoryLeases checks that Run fails at once, saying
// why, for a store whose store.Leaser declares no leases while
// Options.Leases declares some, or one whose declaration has a negative
// time, or stores that declare different leases.
func TestRunRefusesContradictoryLeases(t *testing.T) {
	opts := Options{Capacity: 256 << 10, MaxValueSize: 2048}
	for _, tc := range []struct {
		name     string
		newStore func(int) store.Store
		leases   bool
		reason   string
	}{
		{"OptionsSayLeases", func(int) store.Store { return newLeasingStore(store.Leases{}) }, true, "leave Options.Leases false"},
		{"NegativeTTL", func(int) store.Store { return newLeasingStore(store.Leases{Get: true, TTL: -time.Second}) }, false, "must not be negative"},
		{"Different", func(n int) store.Store { return newLeasingStore(store.Leases{Get: true, TTL: time.Duration(n)}) }, false, "every store must declare the same"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			n := 0
			o := opts
			o.Leases = tc.leases
			got := runRecorded(t, func(testing.TB) store.Store {
				mu.Lock()
				defer mu.Unlock()
				n++
				return tc.newStore(n)
			}, o, "RepeatedKeys")
			if failed := got.FailedUnder("Run"); len(failed) == 0 || !got.SaidUnder("Run", tc.reason) {
				t.Errorf("Run failed %v for a store that declares leases it may not, and did not say %q; it recorded:\n%s", failed, tc.reason, got)
			}
		})
	}
}

// TestWaitNamesWhatHangs checks that a wait for goroutines that never end
// fails, naming what it waited for, once its bound has passed.
func TestWaitNamesWhatHangs(t *testing.T) {
	old := waitBound
	waitBound = 10 * time.Millisecond
	t.Cleanup(func() { waitBound = old })
	r := newRecorder(t, "R")
	var wg sync.WaitGroup
	wg.Add(1)
	defer wg.Done()
	var got any
	func() {
		defer func() { got = recover() }()
		wait(r, "the hanging calls", &wg)
	}()
	if msg, _ := got.(string); !strings.Contains(msg, "the hanging calls") {
		t.Errorf("wait for a WaitGroup never done panicked with %v, want a message naming what it waited for", got)
	}
	if !r.Failed() || !r.Recording().SaidUnder("R", "the hanging calls: not done after") {
		t.Errorf("wait for a WaitGroup never done: failed %v, recorded:\n%s", r.Failed(), r.Recording())
	}

	var done sync.WaitGroup // goroutines that end: wait returns
	done.Go(func() {})
	wait(t, "nothing", &done)
}

// TestRunExpiry runs the harness on correct stores whose keys expire,
// watched (with a reaper) and not (expiring keys as calls find them): it
// must pass, Expiry included; and on stores with one expiry bug each: it
// must fail in Expiry, saying why.
func TestRunExpiry(t *testing.T) {
	opts := func(b bug, watched bool) Options {
		return Options{Capacity: 256 << 10, MaxValueSize: 2048, Stats: true, Counters: AllCounters,
			Expiring: func(_ testing.TB, ttl time.Duration) store.Store { return newExpiringStore(b, ttl, watched) }}
	}
	for _, watched := range []bool{false, true} {
		newStore := func(testing.TB) store.Store { return newExpiringStore(noBug, time.Hour, watched) }
		got := runRecorded(t, newStore, opts(noBug, watched))
		if failed := got.FailedUnder("Run"); len(failed) > 0 {
			t.Errorf("Run (watched %v) failed %v for a correct store whose keys expire; it recorded:\n%s", watched, failed, got)
		}
		if got.SaidUnder("Run/Expiry", "declares no expiry") {
			t.Errorf("Run skipped Expiry for a store that declares Options.Expiring; it recorded:\n%s", got)
		}
	}
	fastRapid(t)
	for _, tc := range []struct {
		name    string
		bug     bug
		watched bool
		reason  string
	}{
		{"ExistsIgnoresExpiry", bugExistsIgnoresExpiry, false, "Exists(\"expiry@Exists@0\")"},
		{"GetIgnoresExpiry", bugGetIgnoresExpiry, false, "Get(\"expiry@Get@0\")"},
		{"GetIgnoresExpiryInBatch", bugGetIgnoresExpiry, false, "Get(\"expiry@Batch@0\")"},
		{"ExpiredKeepsOut", bugExpiredKeepsOut, false, "nor keep out a new one"},
		{"ExpiredCounted", bugExpiredCounted, false, "expired keys are absent, not removed"},
		{"ExpiryAsRemoved", bugExpiryAsRemoved, true, "want store.KeyExpired only"},
		{"ExpiryOnlyOnCall", bugExpiryOnlyOnCall, true, "no store.KeyExpired event"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.bug == bugExpiryOnlyOnCall {
				old := expiryWait
				expiryWait = time.Second // the harness waits its full bound for this one
				t.Cleanup(func() { expiryWait = old })
			}
			newStore := func(testing.TB) store.Store { return newExpiringStore(noBug, time.Hour, tc.watched) }
			got := runRecorded(t, newStore, opts(tc.bug, tc.watched), "Expiry")
			if failed := got.FailedUnder("Run/Expiry"); len(failed) == 0 {
				t.Errorf("Run did not fail in Expiry for a store with bug %s; it recorded:\n%s", tc.name, got)
			} else if !got.SaidUnder("Run/Expiry", tc.reason) {
				t.Errorf("Run failed in %s for a store with bug %s, but never said %q; it recorded:\n%s", failed, tc.name, tc.reason, got)
			}
		})
	}
}
