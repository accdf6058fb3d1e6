package hashing

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

func testNamespace(t testing.TB, edit func(*Identity)) Namespace {
	t.Helper()
	id := validIdentity()
	if edit != nil {
		edit(&id)
	}
	ns, err := id.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func TestKey(t *testing.T) {
	ns := testNamespace(t, nil)
	h := BlockHash{0xab, 0xcd}
	key := ns.Key(1, h)
	want := "acme/" + ns.ID() + "/1/abcd" + strings.Repeat("0", 60)
	if key != want {
		t.Fatalf("Key = %q, want %q", key, want)
	}
	if !strings.HasPrefix(key, ns.Prefix()) || !strings.HasPrefix(key, TenantPrefix("acme")) {
		t.Errorf("key %q does not start with %q and %q", key, ns.Prefix(), TenantPrefix("acme"))
	}
	if got := string(ns.AppendKey([]byte("x"), 1, h)); got != "x"+key {
		t.Errorf("AppendKey = %q, want %q", got, "x"+key)
	}
	k, err := ParseKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Key{Tenant: "acme", Namespace: ns.ID(), Rank: 1, Hash: h}, k); diff != "" {
		t.Errorf("ParseKey (-want +got):\n%s", diff)
	}
	if k.String() != key {
		t.Errorf("String() = %q, want %q", k.String(), key)
	}
	for _, c := range []byte(key) {
		if c < 0x21 || c > 0x7e {
			t.Fatalf("key %q has byte %q outside printable ASCII", key, c)
		}
	}
}

func TestShards(t *testing.T) {
	tests := []struct {
		heads, tp, repl int
		shards          int
		shardOf         []int // shard of each rank
	}{
		{8, 1, 1, 1, []int{0}},
		{8, 4, 1, 4, []int{0, 1, 2, 3}},
		{2, 8, 4, 2, []int{0, 0, 0, 0, 1, 1, 1, 1}},
		{1, 4, 4, 1, []int{0, 0, 0, 0}},
		{8, 8, 2, 4, []int{0, 0, 1, 1, 2, 2, 3, 3}},
	}
	for _, tt := range tests {
		ns := testNamespace(t, func(id *Identity) {
			id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = tt.heads, tt.tp, tt.repl
		})
		if ns.TPSize() != tt.tp || ns.Replication() != tt.repl {
			t.Errorf("TPSize, Replication = %d, %d; want %d, %d", ns.TPSize(), ns.Replication(), tt.tp, tt.repl)
		}
		if ns.Shards() != tt.shards {
			t.Errorf("heads %d tp %d repl %d: Shards() = %d, want %d", tt.heads, tt.tp, tt.repl, ns.Shards(), tt.shards)
		}
		keys := map[string]int{}
		for rank, want := range tt.shardOf {
			if got := ns.Shard(rank); got != want {
				t.Errorf("heads %d tp %d repl %d: Shard(%d) = %d, want %d", tt.heads, tt.tp, tt.repl, rank, got, want)
			}
			keys[ns.Key(ns.Shard(rank), BlockHash{1})]++
		}
		if len(keys) != tt.shards {
			t.Errorf("heads %d tp %d repl %d: %d distinct keys over the ranks, want one per shard (%d)", tt.heads, tt.tp, tt.repl, len(keys), tt.shards)
		}
	}
}

func mustPanic(t *testing.T, name, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if s, _ := r.(string); !strings.Contains(s, want) {
			t.Errorf("%s: recovered %v, want a panic containing %q", name, r, want)
		}
	}()
	f()
}

func TestKeyPanics(t *testing.T) {
	ns := testNamespace(t, func(id *Identity) { id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 2, 8, 4 })
	mustPanic(t, "Key(2)", "shard 2 outside [0, 2)", func() { ns.Key(2, BlockHash{}) })
	mustPanic(t, "Key(-1)", "shard -1 outside [0, 2)", func() { ns.Key(-1, BlockHash{}) })
	mustPanic(t, "Shard(8)", "rank 8 outside [0, 8)", func() { ns.Shard(8) })
	mustPanic(t, "Shard(-1)", "rank -1 outside [0, 8)", func() { ns.Shard(-1) })
	mustPanic(t, "zero Key", "shard 0 outside [0, 0)", func() { Namespace{}.Key(0, BlockHash{}) })
}

func TestTenantPrefix(t *testing.T) {
	// No tenant's prefix is a prefix of another tenant's keys.
	tenants := []string{"a", "ab", "a.b", "a-", "A", "a_b"}
	for _, t1 := range tenants {
		for _, t2 := range tenants {
			if t1 == t2 {
				continue
			}
			ns := testNamespace(t, func(id *Identity) { id.Tenant = t2 })
			if key := ns.Key(0, BlockHash{}); strings.HasPrefix(key, TenantPrefix(t1)) {
				t.Errorf("key %q of tenant %q starts with TenantPrefix(%q) = %q", key, t2, t1, TenantPrefix(t1))
			}
		}
	}
	for _, bad := range []string{"", "a/b", "a b", "-a", "a\x00"} {
		if p := TenantPrefix(bad); p != "" {
			t.Errorf("TenantPrefix(%q) = %q, want \"\"", bad, p)
		}
	}
}

func TestParseKeyErrors(t *testing.T) {
	ns := testNamespace(t, nil)
	good := ns.Key(1, BlockHash{1})
	id := ns.ID()
	h := BlockHash{1}.String()
	tests := []struct{ key, want string }{
		{"", "want 4 fields separated by '/'"},
		{"acme", "want 4 fields"},
		{good + "/x", "have 5"},
		{strings.Repeat("a", 513), "513 bytes, longer than 512"},
		{"/" + id + "/1/" + h, "tenant: required"},
		{"a b/" + id + "/1/" + h, "tenant: byte ' ' at 1"},
		{"acme/" + strings.ToUpper(id) + "/1/" + h, "is not a lowercase hex digit"},
		{"acme/" + id[:31] + "/1/" + h, "has 31 characters, want 32"},
		{"acme/" + id + "//" + h, "shard \"\": empty"},
		{"acme/" + id + "/01/" + h, "leading zero"},
		{"acme/" + id + "/-1/" + h, "'-' at 0 is not a decimal digit"},
		{"acme/" + id + "/+1/" + h, "'+' at 0"},
		{"acme/" + id + "/65536/" + h, "above the largest shard 65535"},
		{"acme/" + id + "/99999999999999999999999/" + h, "above the largest shard"},
		{"acme/" + id + "/1/" + h[:63], "has 63 characters, want 64"},
		{"acme/" + id + "/1/" + h[:63] + "g", "'g' at 63"},
	}
	for _, tt := range tests {
		k, err := ParseKey(tt.key)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrMalformedKey) {
			t.Errorf("ParseKey(%q) = %v, %v; want an ErrMalformedKey containing %q", tt.key, k, err, tt.want)
		}
		if k != (Key{}) {
			t.Errorf("ParseKey(%q) returned a non-zero Key %v with its error", tt.key, k)
		}
	}
}

func TestParseBlockHash(t *testing.T) {
	h := BlockHash{0xff, 1}
	got, err := ParseBlockHash(h.String())
	if err != nil || got != h {
		t.Errorf("ParseBlockHash(%q) = %v, %v", h.String(), got, err)
	}
	for _, bad := range []string{"", "ff", strings.Repeat("F", 64), strings.Repeat("0", 65)} {
		if _, err := ParseBlockHash(bad); !errors.Is(err, ErrMalformedKey) {
			t.Errorf("ParseBlockHash(%q) error = %v, want ErrMalformedKey", bad, err)
		}
	}
	var u BlockHash
	if b, _ := h.MarshalText(); u.UnmarshalText(b) != nil || u != h {
		t.Errorf("text round trip of %v gave %v", h, u)
	}
	if !(BlockHash{}).IsZero() || h.IsZero() {
		t.Error("IsZero is wrong")
	}
}

func TestAppendKeyAllocs(t *testing.T) {
	ns := testNamespace(t, nil)
	buf := make([]byte, 0, MaxKeyLen)
	h := BlockHash{9}
	if n := testing.AllocsPerRun(100, func() { buf = ns.AppendKey(buf[:0], 1, h) }); n != 0 {
		t.Errorf("AppendKey allocates %v times, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = ns.Key(1, h) }); n != 1 {
		t.Errorf("Key allocates %v times, want 1 (the string)", n)
	}
}

func genKey() *rapid.Generator[Key] {
	return rapid.Custom(func(t *rapid.T) Key {
		tenant := rapid.StringMatching(`[A-Za-z0-9][A-Za-z0-9._-]{0,63}`).Draw(t, "tenant")
		id := rapid.StringMatching(`[0-9a-f]{32}`).Draw(t, "namespace")
		var h BlockHash
		copy(h[:], rapid.SliceOfN(rapid.Byte(), 32, 32).Draw(t, "hash"))
		return Key{Tenant: tenant, Namespace: id, Rank: rapid.IntRange(0, maxShard).Draw(t, "rank"), Hash: h}
	})
}

func TestPropKeyRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := genKey().Draw(t, "key")
		s := k.String()
		if len(s) > MaxKeyLen {
			t.Fatalf("key %q is %d bytes", s, len(s))
		}
		got, err := ParseKey(s)
		if err != nil {
			t.Fatalf("ParseKey(%q): %v", s, err)
		}
		if got != k {
			t.Fatalf("ParseKey(%q) = %+v, want %+v", s, got, k)
		}
	})
}
