package hashing

import (
	"errors"
	"strconv"
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
		{good + "/x/y", "have 6"},
		{good + "/x", `group "` + BlockHash{1}.String() + `": want 'g' and the group number`},
		{"acme/" + id + "/1/g0/" + h, `group "g0": group 0 has no group field`},
		{"acme/" + id + "/1/g01/" + h, `group "g01": leading zero`},
		{"acme/" + id + "/1/g00/" + h, `group "g00": leading zero`},
		{"acme/" + id + "/1/g/" + h, `group "g": no group number after 'g'`},
		{"acme/" + id + "/1/G1/" + h, `group "G1": want 'g'`},
		{"acme/" + id + "/1/1/" + h, `group "1": want 'g'`},
		{"acme/" + id + "/1/g+1/" + h, `group "g+1": character '+' at 1 is not a decimal digit`},
		{"acme/" + id + "/1/g1a/" + h, `character 'a' at 2`},
		{"acme/" + id + "/1/g256/" + h, `group "g256": above the largest group 255`},
		{"acme/" + id + "/1/g99999999999999999999999/" + h, "above the largest group 255"},
		{"acme/" + id + "/1//" + h, `group "": want 'g'`},
		{"acme/" + id + "/g1/1/" + h, `shard "g1": character 'g' at 0 is not a decimal digit`},
		{"acme/" + id + "/1/g1/" + h[:63], "hash: has 63 characters"},
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
		// Layer ranges.
		{"acme/" + id + "/1/" + h + "/l2-2", `layers "l2-2": empty range: the first layer 2 is not below the end 2`},
		{"acme/" + id + "/1/" + h + "/l3-2", `layers "l3-2": empty range`},
		{"acme/" + id + "/1/g1/" + h + "/l0-0", "empty range"},
		{"acme/" + id + "/1/" + h + "/l02-3", `layers "l02-3": first layer "02": leading zero`},
		{"acme/" + id + "/1/" + h + "/l00-3", `first layer "00": leading zero`},
		{"acme/" + id + "/1/" + h + "/l2-03", `layers "l2-03": end "03": leading zero`},
		{"acme/" + id + "/1/" + h + "/l-1-2", `first layer "": empty`},
		{"acme/" + id + "/1/" + h + "/l+1-2", `first layer "+1": character '+' at 0 is not a decimal digit`},
		{"acme/" + id + "/1/" + h + "/l1-+2", `end "+2": character '+' at 0`},
		{"acme/" + id + "/1/" + h + "/l1-2-3", `end "2-3": character '-' at 1`},
		{"acme/" + id + "/1/" + h + "/l1-2a", `character 'a' at 1`},
		{"acme/" + id + "/1/" + h + "/l2", `layers "l2": want <lo>-<hi> after 'l'`},
		{"acme/" + id + "/1/" + h + "/l", `layers "l": want <lo>-<hi>`},
		{"acme/" + id + "/1/" + h + "/l2-", `end "": empty`},
		{"acme/" + id + "/1/" + h + "/l-", `first layer "": empty`},
		{"acme/" + id + "/1/" + h + "/L2-3", `layers "L2-3": want 'l' and the layer range`},
		{"acme/" + id + "/1/" + h + "/l0-65537", `end "65537": above the largest layer range end 65536`},
		{"acme/" + id + "/1/" + h + "/l65536-65537", `first layer "65536": above the largest first layer 65535`},
		{"acme/" + id + "/1/" + h + "/l0-99999999999999999999999", "above the largest layer range end 65536"},
		{"acme/" + id + "/1/l2-3/" + h, `group "l2-3": want 'g'`},
		{"acme/" + id + "/l2-3/" + h, `shard "l2-3": character 'l' at 0`},
		{"acme/" + id + "/1/g1/l2-3/" + h, "have 6"},
		{"acme/" + id + "/1/" + h + "/l2-3/l2-3", "group \"" + h + "\": want 'g'"},
		{"acme/" + id + "/1/g1/" + h + "/l2-3/x", "have 7"},
		{"acme/" + id + "/1/g0/" + h + "/l2-3", "group 0 has no group field"},
		{"acme/" + id + "/1/" + h[:63] + "/l2-3", "hash: has 63 characters"},
		{"acme/" + id + "/1/l2-3", "want 4 fields"},
		{"acme/" + id + "/1/" + h + "/l2-3/", "have 6"},
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
		group := rapid.OneOf(rapid.Just(0), rapid.IntRange(0, MaxGroups-1)).Draw(t, "group")
		var layers LayerRange
		if rapid.Bool().Draw(t, "layers?") {
			layers.Lo = rapid.OneOf(rapid.IntRange(0, 9), rapid.IntRange(0, maxLayerEnd-1)).Draw(t, "lo")
			layers.Hi = rapid.OneOf(rapid.IntRange(layers.Lo+1, min(layers.Lo+9, maxLayerEnd)), rapid.IntRange(layers.Lo+1, maxLayerEnd)).Draw(t, "hi")
		}
		return Key{Tenant: tenant, Namespace: id, Rank: rapid.IntRange(0, maxShard).Draw(t, "rank"), Group: group, Hash: h, Layers: layers}
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

func TestGroupKey(t *testing.T) {
	// Qwen3-Next-like: 2 KV heads over 4 ranks (replication 2), a state
	// group first, then a full-attention group and a sliding-window one.
	id := validIdentity()
	id.Layout = Layout{Layers: 6, KVHeads: 2, HeadDim: 128, BlockSize: 16, TPSize: 4, Replication: 2, Groups: []Group{
		{Kind: RecurrentState, Layers: []int{0, 1, 2}, BlockSize: 32, StateBytes: 4096},
		{Kind: FullAttention, Layers: []int{3, 5}, BlockSize: 16},
		{Kind: SlidingWindow, Layers: []int{4}, BlockSize: 16, Window: 64},
	}}
	ns, err := id.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(id.Layout.Groups, ns.Groups()); diff != "" {
		t.Errorf("Groups() (-want +got):\n%s", diff)
	}
	ns.Groups()[0].Layers[0] = 9 // a copy: ns is unchanged
	if ns.Groups()[0].Layers[0] != 0 {
		t.Error("changing the result of Groups changed the namespace")
	}
	if ns.Shards() != 2 || ns.GroupShards(0) != 4 || ns.GroupShards(1) != 2 || ns.GroupShards(2) != 2 {
		t.Errorf("Shards, GroupShards(0, 1, 2) = %d, %d, %d, %d; want 2, 4, 2, 2", ns.Shards(), ns.GroupShards(0), ns.GroupShards(1), ns.GroupShards(2))
	}
	for rank := range 4 {
		if got := ns.GroupShard(0, rank); got != rank {
			t.Errorf("GroupShard(0, %d) = %d, want the rank (a state group)", rank, got)
		}
		for g := 1; g < 3; g++ {
			if got, want := ns.GroupShard(g, rank), ns.Shard(rank); got != want {
				t.Errorf("GroupShard(%d, %d) = %d, want Shard(%d) = %d", g, rank, got, rank, want)
			}
		}
	}
	h := BlockHash{0xab, 0xcd}
	hex := "abcd" + strings.Repeat("0", 60)
	keys := map[string]bool{}
	for g := range 3 {
		for shard := range ns.GroupShards(g) {
			key := ns.GroupKey(g, shard, h)
			want := ns.Prefix() + strconv.Itoa(shard) + "/" + hex
			if g > 0 {
				want = ns.Prefix() + strconv.Itoa(shard) + "/g" + strconv.Itoa(g) + "/" + hex
			}
			if key != want {
				t.Errorf("GroupKey(%d, %d) = %q, want %q", g, shard, key, want)
			}
			if got := string(ns.AppendGroupKey([]byte("x"), g, shard, h)); got != "x"+key {
				t.Errorf("AppendGroupKey(%d, %d) = %q, want %q", g, shard, got, "x"+key)
			}
			k, err := ParseKey(key)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(Key{Tenant: "acme", Namespace: ns.ID(), Rank: shard, Group: g, Hash: h}, k); diff != "" {
				t.Errorf("ParseKey(%q) (-want +got):\n%s", key, diff)
			}
			if k.String() != key {
				t.Errorf("String() = %q, want %q", k.String(), key)
			}
			if keys[key] {
				t.Errorf("key %q of group %d shard %d is another's too", key, g, shard)
			}
			keys[key] = true
		}
	}
	// Key is group 0's key, with group 0's shards: here a state group's.
	if got, want := ns.Key(3, h), ns.GroupKey(0, 3, h); got != want {
		t.Errorf("Key(3) = %q, want GroupKey(0, 3) = %q", got, want)
	}
	// The groups of a layout without groups: one, whose keys are Key's.
	plain := testNamespace(t, nil)
	if n := len(plain.Groups()); n != 1 || plain.GroupShards(0) != plain.Shards() {
		t.Errorf("a layout without groups: %d groups with %d shards, want 1 with %d", n, plain.GroupShards(0), plain.Shards())
	}
	if plain.GroupKey(0, 1, h) != plain.Key(1, h) {
		t.Errorf("GroupKey(0, 1) = %q, Key(1) = %q", plain.GroupKey(0, 1, h), plain.Key(1, h))
	}
	if (Namespace{}).Groups() != nil {
		t.Error("the zero Namespace has groups")
	}
}

func TestGroupKeyPanics(t *testing.T) {
	ns := testNamespace(t, func(id *Identity) {
		*id = stateIdentity() // group 0 state (2 shards, the ranks), group 1 full attention
		id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 2, 4, 2
	})
	mustPanic(t, "GroupKey(2, 0)", "Namespace.GroupKey: group 2 outside [0, 2)", func() { ns.GroupKey(2, 0, BlockHash{}) })
	mustPanic(t, "GroupKey(-1, 0)", "Namespace.GroupKey: group -1 outside [0, 2)", func() { ns.GroupKey(-1, 0, BlockHash{}) })
	mustPanic(t, "GroupKey(1, 2)", "Namespace.GroupKey: shard 2 outside [0, 2) of group 1", func() { ns.GroupKey(1, 2, BlockHash{}) })
	mustPanic(t, "GroupKey(0, 4)", "Namespace.GroupKey: shard 4 outside [0, 4) of group 0", func() { ns.GroupKey(0, 4, BlockHash{}) })
	mustPanic(t, "GroupKey(0, -1)", "shard -1 outside [0, 4) of group 0", func() { ns.GroupKey(0, -1, BlockHash{}) })
	mustPanic(t, "Key(4)", "Namespace.Key: shard 4 outside [0, 4)", func() { ns.Key(4, BlockHash{}) })
	mustPanic(t, "GroupShards(2)", "Namespace.GroupShards: group 2 outside [0, 2)", func() { ns.GroupShards(2) })
	mustPanic(t, "GroupShard(2, 0)", "Namespace.GroupShard: group 2 outside [0, 2)", func() { ns.GroupShard(2, 0) })
	mustPanic(t, "GroupShard(0, 4)", "Namespace.GroupShard: rank 4 outside [0, 4)", func() { ns.GroupShard(0, 4) })
	mustPanic(t, "zero GroupKey", "group 0 outside [0, 0)", func() { (Namespace{}).GroupKey(0, 0, BlockHash{}) })
	mustPanic(t, "zero GroupShards", "group 0 outside [0, 0)", func() { (Namespace{}).GroupShards(0) })
}

func TestAppendGroupKeyAllocs(t *testing.T) {
	ns := testNamespace(t, func(id *Identity) { *id = hybridIdentity() })
	buf := make([]byte, 0, MaxKeyLen)
	if n := testing.AllocsPerRun(100, func() { buf = ns.AppendGroupKey(buf[:0], 1, 1, BlockHash{9}) }); n != 0 {
		t.Errorf("AppendGroupKey allocates %v times, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = ns.GroupKey(1, 1, BlockHash{9}) }); n != 1 {
		t.Errorf("GroupKey allocates %v times, want 1 (the string)", n)
	}
}

// TestLongestKey checks the bounds that MaxKeyLen's doc gives: the longest
// tenant, shard and group, then the longest layer range.
func TestLongestKey(t *testing.T) {
	k := Key{Tenant: strings.Repeat("a", 64), Namespace: strings.Repeat("f", IDLen), Rank: maxShard, Group: MaxGroups - 1, Hash: BlockHash{1}}
	for _, tt := range []struct {
		layers LayerRange
		want   int
	}{{LayerRange{}, 173}, {LayerRange{maxLayerEnd - 1, maxLayerEnd}, 186}} {
		k.Layers = tt.layers
		s := k.String()
		if len(s) != tt.want || len(s) > MaxKeyLen {
			t.Errorf("the longest key %q has %d bytes, want %d (MaxKeyLen %d)", s, len(s), tt.want, MaxKeyLen)
		}
		if got, err := ParseKey(s); err != nil || got != k {
			t.Errorf("ParseKey(%q) = %+v, %v", s, got, err)
		}
	}
}

func TestLayerKey(t *testing.T) {
	ns := testNamespace(t, func(id *Identity) { *id = hybridIdentity() }) // two groups of 4 layers
	h := BlockHash{0xab, 0xcd}
	hex := "abcd" + strings.Repeat("0", 60)
	tests := []struct {
		group, shard, lo, hi int
		want                 string
		layers               LayerRange
	}{
		{0, 1, 0, 1, "1/" + hex + "/l0-1", LayerRange{0, 1}},
		{0, 0, 1, 4, "0/" + hex + "/l1-4", LayerRange{1, 4}},
		{0, 1, 0, 3, "1/" + hex + "/l0-3", LayerRange{0, 3}},
		{1, 1, 2, 3, "1/g1/" + hex + "/l2-3", LayerRange{2, 3}},
		{1, 0, 3, 4, "0/g1/" + hex + "/l3-4", LayerRange{3, 4}},
		{0, 1, 0, 4, "1/" + hex, LayerRange{}},    // the whole group: the block's key
		{1, 1, 0, 4, "1/g1/" + hex, LayerRange{}}, // the same in group 1
	}
	for _, tt := range tests {
		key := ns.LayerKey(tt.group, tt.shard, h, tt.lo, tt.hi)
		if want := ns.Prefix() + tt.want; key != want {
			t.Errorf("LayerKey(%d, %d, %d, %d) = %q, want %q", tt.group, tt.shard, tt.lo, tt.hi, key, want)
		}
		if got := string(ns.AppendLayerKey([]byte("x"), tt.group, tt.shard, h, tt.lo, tt.hi)); got != "x"+key {
			t.Errorf("AppendLayerKey(%d, %d, %d, %d) = %q, want %q", tt.group, tt.shard, tt.lo, tt.hi, got, "x"+key)
		}
		if tt.layers == (LayerRange{}) {
			if gk := ns.GroupKey(tt.group, tt.shard, h); key != gk {
				t.Errorf("LayerKey(%d, %d, %d, %d) = %q, want GroupKey = %q", tt.group, tt.shard, tt.lo, tt.hi, key, gk)
			}
		}
		k, err := ParseKey(key)
		if err != nil {
			t.Fatal(err)
		}
		want := Key{Tenant: "acme", Namespace: ns.ID(), Rank: tt.shard, Group: tt.group, Hash: h, Layers: tt.layers}
		if diff := cmp.Diff(want, k); diff != "" {
			t.Errorf("ParseKey(%q) (-want +got):\n%s", key, diff)
		}
		if k.String() != key {
			t.Errorf("String() = %q, want %q", k.String(), key)
		}
	}
	// Every split of a group into ranges gives one key per range, distinct
	// from the block's and from every other range's; the ranges of two
	// splits that coincide share their key.
	keys := map[string]LayerRange{ns.GroupKey(1, 0, h): {0, 4}}
	for lo := range 4 {
		for hi := lo + 1; hi <= 4; hi++ {
			key := ns.LayerKey(1, 0, h, lo, hi)
			if r, ok := keys[key]; ok && r != (LayerRange{lo, hi}) {
				t.Errorf("LayerKey(1, 0, %d, %d) = %q, the key of layers %v too", lo, hi, key, r)
			}
			keys[key] = LayerRange{lo, hi}
			if !strings.HasPrefix(key, ns.Prefix()) {
				t.Errorf("LayerKey(1, 0, %d, %d) = %q does not start with the namespace prefix %q", lo, hi, key, ns.Prefix())
			}
		}
	}
	if len(keys) != 10 {
		t.Errorf("%d distinct keys over the 10 layer ranges of 4 layers, want 10", len(keys))
	}
	// A layout without groups: the ranges are of all the model's layers.
	plain := testNamespace(t, nil) // 32 layers
	if got, want := plain.LayerKey(0, 1, h, 31, 32), plain.Key(1, h)+"/l31-32"; got != want {
		t.Errorf("LayerKey(0, 1, 31, 32) = %q, want %q", got, want)
	}
	if got, want := plain.LayerKey(0, 1, h, 0, 32), plain.Key(1, h); got != want {
		t.Errorf("LayerKey(0, 1, 0, 32) = %q, want Key(1) = %q", got, want)
	}
}

func TestLayerKeyPanics(t *testing.T) {
	ns := testNamespace(t, func(id *Identity) { *id = stateIdentity() }) // group 0: 7 state layers, 2 shards; group 1: 1 layer
	h := BlockHash{}
	mustPanic(t, "LayerKey(2, 0, 0, 1)", "Namespace.LayerKey: group 2 outside [0, 2)", func() { ns.LayerKey(2, 0, h, 0, 1) })
	mustPanic(t, "LayerKey(-1, 0, 0, 1)", "Namespace.LayerKey: group -1 outside [0, 2)", func() { ns.LayerKey(-1, 0, h, 0, 1) })
	mustPanic(t, "LayerKey(0, 2, 0, 1)", "Namespace.LayerKey: shard 2 outside [0, 2) of group 0", func() { ns.LayerKey(0, 2, h, 0, 1) })
	mustPanic(t, "LayerKey(0, 0, 0, 8)", "Namespace.LayerKey: layers [0, 8) of group 0, want 0 <= lo < hi <= 7", func() { ns.LayerKey(0, 0, h, 0, 8) })
	mustPanic(t, "LayerKey(0, 0, 3, 3)", "layers [3, 3) of group 0", func() { ns.LayerKey(0, 0, h, 3, 3) })
	mustPanic(t, "LayerKey(0, 0, 4, 3)", "layers [4, 3) of group 0", func() { ns.LayerKey(0, 0, h, 4, 3) })
	mustPanic(t, "LayerKey(0, 0, -1, 2)", "layers [-1, 2) of group 0", func() { ns.LayerKey(0, 0, h, -1, 2) })
	mustPanic(t, "LayerKey(1, 0, 0, 2)", "layers [0, 2) of group 1, want 0 <= lo < hi <= 1", func() { ns.LayerKey(1, 0, h, 0, 2) })
	mustPanic(t, "LayerKey(1, 0, 1, 1)", "layers [1, 1) of group 1", func() { ns.LayerKey(1, 0, h, 1, 1) })
	mustPanic(t, "zero LayerKey", "group 0 outside [0, 0)", func() { (Namespace{}).LayerKey(0, 0, h, 0, 1) })
}

func TestAppendLayerKeyAllocs(t *testing.T) {
	ns := testNamespace(t, func(id *Identity) { *id = hybridIdentity() })
	buf := make([]byte, 0, MaxKeyLen)
	if n := testing.AllocsPerRun(100, func() { buf = ns.AppendLayerKey(buf[:0], 1, 1, BlockHash{9}, 1, 3) }); n != 0 {
		t.Errorf("AppendLayerKey allocates %v times, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = ns.LayerKey(1, 1, BlockHash{9}, 1, 3) }); n != 1 {
		t.Errorf("LayerKey allocates %v times, want 1 (the string)", n)
	}
}

// TestPropLayerKey checks LayerKey against the groups of random
// identities: every range but the whole group's gives a key with its
// layer field, which parses back to it.
func TestPropLayerKey(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		id := genIdentity().Draw(t, "identity")
		ns, err := id.Namespace()
		if err != nil {
			t.Fatal(err)
		}
		groups := ns.Groups()
		g := rapid.IntRange(0, len(groups)-1).Draw(t, "group")
		n := len(groups[g].Layers)
		if got := ns.groupLayers(g); got != n {
			t.Fatalf("groupLayers(%d) = %d, want %d", g, got, n)
		}
		shard := rapid.IntRange(0, ns.GroupShards(g)-1).Draw(t, "shard")
		lo := rapid.IntRange(0, n-1).Draw(t, "lo")
		hi := rapid.IntRange(lo+1, n).Draw(t, "hi")
		var h BlockHash
		copy(h[:], rapid.SliceOfN(rapid.Byte(), 32, 32).Draw(t, "hash"))
		key := ns.LayerKey(g, shard, h, lo, hi)
		want := Key{Tenant: id.Tenant, Namespace: ns.ID(), Rank: shard, Group: g, Hash: h, Layers: LayerRange{lo, hi}}
		if lo == 0 && hi == n {
			want.Layers = LayerRange{}
		}
		if want.String() != key {
			t.Fatalf("LayerKey(%d, %d, %d, %d) = %q, want %q", g, shard, lo, hi, key, want.String())
		}
		got, err := ParseKey(key)
		if err != nil || got != want {
			t.Fatalf("ParseKey(%q) = %+v, %v; want %+v", key, got, err, want)
		}
	})
}

// TestPropLayerFieldCanonical appends random layer fields, canonical or
// not, to a valid key: those that parse give back the string and a
// range 0 <= lo < hi <= 65536.
func TestPropLayerFieldCanonical(t *testing.T) {
	ns := testNamespace(t, func(id *Identity) { *id = hybridIdentity() })
	rapid.Check(t, func(t *rapid.T) {
		base := rapid.SampledFrom([]string{ns.Key(1, BlockHash{7}), ns.GroupKey(1, 0, BlockHash{8})}).Draw(t, "block key")
		field := rapid.OneOf(
			rapid.StringOfN(rapid.RuneFrom([]rune("l0123456789-")), 0, 14, -1),
			rapid.StringMatching(`l(0|[1-9][0-9]{0,5})-(0|[1-9][0-9]{0,5})`),
			rapid.StringMatching(`[lL]0?[0-9]{1,3}-0?[0-9]{1,3}`),
		).Draw(t, "field")
		s := base + "/" + field
		k, err := ParseKey(s)
		if err != nil {
			if !errors.Is(err, ErrMalformedKey) || k != (Key{}) {
				t.Fatalf("ParseKey(%q) = %+v, %v", s, k, err)
			}
			return
		}
		if got := k.String(); got != s {
			t.Fatalf("ParseKey(%q).String() = %q", s, got)
		}
		if r := k.Layers; r.Lo < 0 || r.Lo >= r.Hi || r.Hi > maxLayerEnd || k.Layers == (LayerRange{}) {
			t.Fatalf("ParseKey(%q) = %+v, not a layer range's key", s, k)
		}
	})
}
