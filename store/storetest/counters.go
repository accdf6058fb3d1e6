package storetest

import (
	"fmt"
	"strings"

	"github.com/kvconnect/kvconnect/store"
)

// Counter is a set of the cumulative fields of [store.Stats], for
// [Options.Counters]: the counters a store keeps exactly, which Run then
// checks against the calls its state machine made.
type Counter uint16

// The cumulative fields of store.Stats, and what each must count. Run
// checks each after every step of its state machine, when no call is in
// flight.
const (
	CounterHits         Counter = 1 << iota // Hits: one per key Get (or GetV) reported found
	CounterMisses                           // Misses: one per key Get (or GetV) reported store.ErrNotFound
	CounterExists                           // Exists: one per valid key of an Exists call
	CounterPuts                             // Puts: one per key Put (or PutV) stored, absent before
	CounterDuplicates                       // Duplicates: one per successful put of a present key, a repeat within a batch included
	CounterRejectedPuts                     // RejectedPuts: one per key a put refused with store.ErrNoSpace
	CounterEvictions                        // Evictions: one per key evicted; at least the keys Run saw vanish, at most the keys stored
	CounterBytesIn                          // BytesIn: the value bytes of the puts counted in Puts
	CounterBytesOut                         // BytesOut: the value bytes of the gets counted in Hits

	// AllCounters is every counter above.
	AllCounters = CounterHits | CounterMisses | CounterExists | CounterPuts | CounterDuplicates |
		CounterRejectedPuts | CounterEvictions | CounterBytesIn | CounterBytesOut
)

var counterNames = []struct {
	c    Counter
	name string
}{
	{CounterHits, "Hits"},
	{CounterMisses, "Misses"},
	{CounterExists, "Exists"},
	{CounterPuts, "Puts"},
	{CounterDuplicates, "Duplicates"},
	{CounterRejectedPuts, "RejectedPuts"},
	{CounterEvictions, "Evictions"},
	{CounterBytesIn, "BytesIn"},
	{CounterBytesOut, "BytesOut"},
}

// String names the counters of c, as "Hits|Misses".
func (c Counter) String() string {
	var names []string
	for _, n := range counterNames {
		if c&n.c != 0 {
			names = append(names, n.name)
		}
	}
	if rest := c &^ AllCounters; rest != 0 {
		names = append(names, fmt.Sprintf("%#x", uint16(rest)))
	}
	if len(names) == 0 {
		return "0"
	}
	return strings.Join(names, "|")
}

// tally is what the state machine's calls say the counters must read: an
// exact value for most, and for Puts (so for Duplicates and BytesIn) a
// range, where a key the model holds may have been evicted or left by a
// removal, so that a put of it may have stored it or found it present.
type tally struct {
	hits, misses, exists, rejected, bytesOut int64
	stored                                   int64 // successful puts of a key
	putsLo, putsHi                           int64
	inLo, inHi                               int64
	vanished                                 int64 // keys seen to vanish, each by an eviction
}

// checkCounters compares the counters opts declares with what the calls
// made say, and returns what differs, or "".
func checkCounters(opts Options, st store.Stats, w tally) string {
	var bad []string
	check := func(c Counter, name string, got, lo, hi int64, why string) {
		if opts.Counters&c == 0 || got >= lo && got <= hi {
			return
		}
		want := fmt.Sprint(lo)
		if hi != lo {
			want = fmt.Sprintf("%d to %d", lo, hi)
		}
		bad = append(bad, fmt.Sprintf("Stats().%s = %d, want %s (%s)", name, got, want, why))
	}
	check(CounterHits, "Hits", st.Hits, w.hits, w.hits, "the keys Get reported found")
	check(CounterMisses, "Misses", st.Misses, w.misses, w.misses, "the keys Get reported store.ErrNotFound")
	check(CounterExists, "Exists", st.Exists, w.exists, w.exists, "the keys Exists probed")
	check(CounterBytesOut, "BytesOut", st.BytesOut, w.bytesOut, w.bytesOut, "the value bytes of the keys Get found")
	check(CounterRejectedPuts, "RejectedPuts", st.RejectedPuts, w.rejected, w.rejected, "the keys put refused with store.ErrNoSpace")
	check(CounterPuts, "Puts", st.Puts, w.putsLo, w.putsHi, fmt.Sprintf("the keys put that were absent, of %d put with success", w.stored))
	check(CounterDuplicates, "Duplicates", st.Duplicates, w.stored-w.putsHi, w.stored-w.putsLo,
		fmt.Sprintf("the keys put that were present, a repeat within a batch included, of %d put with success", w.stored))
	check(CounterBytesIn, "BytesIn", st.BytesIn, w.inLo, w.inHi, "the value bytes of the keys put that were absent")
	if opts.Counters&(CounterPuts|CounterDuplicates) == CounterPuts|CounterDuplicates && st.Puts+st.Duplicates != w.stored {
		bad = append(bad, fmt.Sprintf("Stats().Puts + Stats().Duplicates = %d + %d, want %d (the keys put with success)", st.Puts, st.Duplicates, w.stored))
	}
	if opts.Evicts {
		check(CounterEvictions, "Evictions", st.Evictions, w.vanished, w.putsHi, "at least the keys seen to vanish, at most the keys stored")
	} else {
		check(CounterEvictions, "Evictions", st.Evictions, 0, 0, "the store declares no eviction")
	}
	return strings.Join(bad, "; ")
}
