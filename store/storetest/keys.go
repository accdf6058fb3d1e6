package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// distinctKeys returns keys that a store must keep apart although they
// look alike, each with why it differs from the one it looks like: keys of
// store.MaxKeyLen bytes that share all but one byte (a store that
// truncates keys, or hashes a short prefix of them, conflates them), keys
// that are prefixes of each other, and keys that differ only in case.
func distinctKeys() []struct{ key, why string } {
	base := "key@long@"
	for i := 0; len(base) < store.MaxKeyLen; i++ {
		base += string(rune('a' + i%26))
	}
	at := func(i int) string { // base with byte i changed
		b := []byte(base)
		b[i] ^= 0x01
		return string(b)
	}
	out := []struct{ key, why string }{
		{base, fmt.Sprintf("a key of store.MaxKeyLen (%d) bytes", store.MaxKeyLen)},
		{at(store.MaxKeyLen - 1), "differs from the longest key in its last byte only"},
		{at(256), "differs from the longest key in byte 256 only"},
		{at(250), "differs from the longest key in byte 250 only"},
		{at(128), "differs from the longest key in byte 128 only"},
		{at(64), "differs from the longest key in byte 64 only"},
		{base[:store.MaxKeyLen-1], "the longest key but its last byte"},
		{base[:300], "the first 300 bytes of the longest key"},
		{base[:250], "the first 250 bytes of the longest key"},
		{"key@case@abc", "lower case"},
		{"key@case@ABC", "differs from key@case@abc in case only"},
		{"key@case@Abc", "differs from key@case@abc in case only"},
		{"KEY@case@abc", "differs from key@case@abc in case only"},
		{"key@k", "a prefix of key@k1"},
		{"key@k1", "a prefix of key@k10"},
		{"key@k10", "starts with key@k1"},
	}
	return out
}

// distinct puts keys that look alike, each with a value of its own size,
// and reads every one back: each must hold its own value, and removing one
// must leave the others.
func (h *harness) distinct(t tester) {
	keys := distinctKeys()
	n := len(keys)
	mem := newMemory(t, n, 64+n)
	s := h.open(t, mem)
	names := make([]string, n)
	src := make([]rdma.Region, n)
	vals := make([][]byte, n)
	for i, k := range keys {
		names[i] = k.key
		vals[i] = value(k.key, 1, 32+i) // sizes tell the values apart too
		copy(mem.bytes(i), vals[i])
		src[i] = mem.slot(i, len(vals[i]))
	}
	res := make([]store.Result, n)
	if err := s.Put(background, names, src, res); err != nil {
		t.Fatalf("Put of %d keys that look alike = %v, want nil", n, err)
	}
	for i, r := range res {
		if r.Err != nil && !(h.opts.Evicts && errors.Is(r.Err, store.ErrNoSpace)) {
			t.Fatalf("Put(%s) (%s): %v, want nil", keyName(names[i]), keys[i].why, r.Err)
		}
	}
	// owner names the key whose value got is, if any.
	owner := func(got []byte) string {
		for j := range vals {
			if bytes.Equal(got, vals[j]) {
				return "the value of " + keyName(names[j])
			}
		}
		return "no key's value"
	}
	// read checks that every key holds its value, but for those in gone,
	// which must be absent.
	read := func(after string, gone map[string]bool) {
		t.Helper()
		for i := range names {
			canary(mem.bytes(i))
			src[i] = mem.slot(i, mem.slotSize)
		}
		if err := s.Get(background, names, src, res); err != nil {
			t.Fatalf("%sGet of %d keys that look alike = %v, want nil", after, n, err)
		}
		for i, r := range res {
			k := names[i]
			switch {
			case gone[k]:
				if !errors.Is(r.Err, store.ErrNotFound) {
					t.Errorf("%sGet(%s) = {N: %d, Err: %v}, want store.ErrNotFound: it was removed", after, keyName(k), r.N, r.Err)
				}
			case h.opts.Evicts && errors.Is(r.Err, store.ErrNotFound):
				t.Logf("%sGet(%s): %v: evicted, not checked", after, keyName(k), r.Err)
			case errors.Is(r.Err, store.ErrNotFound):
				t.Errorf("%sGet(%s) (%s): %v, want its value: removing another key took it (the store conflates them)", after, keyName(k), keys[i].why, r.Err)
			case r.Err != nil:
				t.Errorf("%sGet(%s) (%s): %v, want its value", after, keyName(k), keys[i].why, r.Err)
			case !bytes.Equal(mem.bytes(i)[:r.N], vals[i]):
				t.Errorf("%sGet(%s) (%s) returned %d bytes, %s, want its own %d bytes: the store conflates keys that differ",
					after, keyName(k), keys[i].why, r.N, owner(mem.bytes(i)[:r.N]), len(vals[i]))
			}
		}
	}
	read("", nil)

	// Remove every other key: the rest stay.
	gone := map[string]bool{}
	for i := 0; i < n; i += 2 {
		err := s.Remove(background, names[i])
		switch {
		case err == nil:
			gone[names[i]] = true
		case h.opts.Leases && errors.Is(err, store.ErrHasLease):
		case h.opts.Evicts && errors.Is(err, store.ErrNotFound):
		default:
			t.Errorf("Remove(%s) = %v, want nil", keyName(names[i]), err)
		}
	}
	read("after removing every other key: ", gone)
}

// keyName quotes k, or for a long key its first and last bytes and its
// length.
func keyName(k string) string {
	if len(k) <= 64 {
		return fmt.Sprintf("%q", k)
	}
	return fmt.Sprintf("%q...%q (%d bytes)", k[:20], k[len(k)-12:], len(k))
}

// prefixCase is a RemovePrefix and the keys it must take and leave.
type prefixCase struct {
	name   string
	prefix string
	in     []string // keys that start with prefix: removed
	out    []string // keys that do not: kept, although a pattern would match them
}

// prefixCases are prefixes holding the metacharacters of regular
// expressions and glob patterns, each with keys that start with it and
// keys that do not but that the prefix would match as a pattern, and
// prefixes of each other.
var prefixCases = []prefixCase{
	{"Dot", "p@a.b/", []string{"p@a.b/k", "p@a.b/"}, []string{"p@axb/k", "p@a.b", "p@a.bb/k", "p@a.c/k"}},
	{"Star", "p@a*", []string{"p@a*", "p@a*b", "p@a**"}, []string{"p@abc", "p@a", "p@ba*", "p@a/*", "p@aa*"}},
	{"Brackets", "p@a[bc]/", []string{"p@a[bc]/k"}, []string{"p@ab/k", "p@ac/k", "p@a[b/k", "p@a[bc]"}},
	{"OpenBracket", "p@a[", []string{"p@a[", "p@a[k"}, []string{"p@a", "p@ak"}},
	{"Plus", "p@a+b", []string{"p@a+b/k"}, []string{"p@ab/k", "p@aab/k", "p@a+"}},
	{"Question", "p@a?b", []string{"p@a?b/k"}, []string{"p@b/k", "p@ab/k", "p@axb/k"}},
	{"Backslash", `p@a\d`, []string{`p@a\d/k`, `p@a\d`}, []string{"p@a1/k", "p@ad/k", `p@a\\d/k`}},
	{"Dollar", "p@a$b", []string{"p@a$b/k"}, []string{"p@a", "p@ab/k", "p@a$"}},
	{"Caret", "p@^a", []string{"p@^a/k"}, []string{"p@a/k", "p@^b/k"}},
	{"Parens", "p@a(b)", []string{"p@a(b)/k"}, []string{"p@ab/k", "p@a(b/k"}},
	{"OpenParen", "p@(a", []string{"p@(a/k"}, []string{"p@a/k"}},
	{"Bar", "p@a|b", []string{"p@a|b/k"}, []string{"p@a/k", "p@b/k", "p@xb"}},
	{"Braces", "p@a{2}", []string{"p@a{2}/k"}, []string{"p@aa/k", "p@a{2"}},
	{"PrefixOfOthers", "p@t1", []string{"p@t1", "p@t1/x", "p@t10/x", "p@t1x"}, []string{"p@t2/x", "p@T1/x", "p@t/x", "p@xt1/x", "p@t", "x@p@t1/x"}},
	{"SlashEnds", "p@t1/", []string{"p@t1/x", "p@t1/"}, []string{"p@t10/x", "p@t1", "p@t1x", "p@T1/x"}},
	{"WholeKey", "p@k/abc", []string{"p@k/abc", "p@k/abcd"}, []string{"p@k/ab", "p@k/abC"}},
}

// prefixes runs RemovePrefix for each of prefixCases on a store of its
// own holding the case's keys: it must remove exactly the keys that start
// with the prefix, byte for byte, and report how many.
func (h *harness) prefixes(t tester) {
	for _, c := range prefixCases {
		t.run(c.name, func(t tester) { h.prefix(t, c) })
	}
}

func (h *harness) prefix(t tester, c prefixCase) {
	keys := slices.Concat(c.in, c.out)
	for _, k := range keys { // a mistake in the cases, not in the store
		if strings.HasPrefix(k, c.prefix) != slices.Contains(c.in, k) {
			panic(fmt.Sprintf("storetest: prefix case %s: key %q is on the wrong side", c.name, k))
		}
	}
	n := len(keys)
	mem := newMemory(t, n, 64)
	s := h.open(t, mem)
	src := make([]rdma.Region, n)
	for i, k := range keys {
		fillValue(mem.bytes(i), k, 1)
		src[i] = mem.slot(i, 16+i)
	}
	res := make([]store.Result, n)
	if err := s.Put(background, keys, src, res); err != nil {
		t.Fatalf("Put(%q) = %v, want nil", keys, err)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("Put(%q): %v, want nil", keys[i], r.Err)
		}
	}
	before := h.evictions(s)
	call := fmt.Sprintf("RemovePrefix(%q)", c.prefix)
	got, err := s.RemovePrefix(background, c.prefix)
	leased := h.opts.Leases && errors.Is(err, store.ErrHasLease)
	switch {
	case err != nil && !leased:
		t.Errorf("%s = %d, %v; want %d and a nil error (the keys that start with it: %q)", call, got, err, len(c.in), c.in)
	case got == len(c.in):
	case got < len(c.in) && (h.opts.Leases || h.opts.Evicts):
		t.Logf("%s = %d of the %d keys that start with it: the others may be under a lease or evicted", call, got, len(c.in))
	default:
		t.Errorf("%s = %d, want %d (the keys that start with it: %q)", call, got, len(c.in), c.in)
	}
	if err := s.Exists(background, keys, res); err != nil {
		t.Fatalf("Exists(%q) after %s = %v, want nil", keys, call, err)
	}
	evicted := before < 0 || h.evictions(s) != before
	for i, r := range res {
		k := keys[i]
		switch in := i < len(c.in); {
		case r.Err != nil && !errors.Is(r.Err, store.ErrNotFound):
			t.Errorf("Exists(%q) after %s: %v, want nil or store.ErrNotFound", k, call, r.Err)
		case in && r.Err == nil && !(h.opts.Leases && got < len(c.in)):
			t.Errorf("%s left %q, which starts with it", call, k)
		case !in && r.Err != nil && h.opts.Evicts && evicted:
			t.Logf("%s: %q, which does not start with it, is gone: evicted, not checked", call, k)
		case !in && r.Err != nil:
			t.Errorf("%s removed %q, which does not start with it (a prefix is matched byte for byte, not as a pattern, a suffix or a substring)", call, k)
		}
	}
}

// evictions returns the store's count of evictions, or -1 when it does
// not declare that it counts them (Options.Counters): then any key may
// have been evicted at any time.
func (h *harness) evictions(s store.Store) int64 {
	if h.opts.Counters&CounterEvictions == 0 {
		return -1
	}
	return s.Stats().Evictions
}
