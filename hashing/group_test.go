package hashing

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestGroupKindText(t *testing.T) {
	for _, tt := range []struct {
		kind GroupKind
		text string
	}{{FullAttention, "full"}, {SlidingWindow, "sliding_window"}, {RecurrentState, "state"}} {
		if got := tt.kind.String(); got != tt.text {
			t.Errorf("GroupKind(%d).String() = %q, want %q", tt.kind, got, tt.text)
		}
		b, err := tt.kind.MarshalText()
		if err != nil || string(b) != tt.text {
			t.Errorf("GroupKind(%d).MarshalText() = %q, %v; want %q", tt.kind, b, err, tt.text)
		}
		var k GroupKind
		if err := k.UnmarshalText([]byte(tt.text)); err != nil || k != tt.kind {
			t.Errorf("UnmarshalText(%q) = %d, %v; want %d", tt.text, k, err, tt.kind)
		}
		if !tt.kind.Known() {
			t.Errorf("GroupKind(%d).Known() = false", tt.kind)
		}
	}
	for _, bad := range []GroupKind{0, 4, 255} {
		if b, err := bad.MarshalText(); err == nil || !strings.Contains(err.Error(), "unknown group kind") {
			t.Errorf("GroupKind(%d).MarshalText() = %q, %v; want an unknown group kind error", bad, b, err)
		}
		if bad.Known() {
			t.Errorf("GroupKind(%d).Known() = true", bad)
		}
	}
	if got := GroupKind(9).String(); got != "GroupKind(9)" {
		t.Errorf("GroupKind(9).String() = %q", got)
	}
	for _, bad := range []string{"", "Full", "full ", "sliding", "mamba", "FULL", "state\x00"} {
		k := SlidingWindow
		err := k.UnmarshalText([]byte(bad))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "kind" || !strings.Contains(err.Error(), "unknown group kind (known: full, sliding_window, state)") {
			t.Errorf("UnmarshalText(%q) = %v, want a *FieldError for kind", bad, err)
		}
		if k != SlidingWindow {
			t.Errorf("UnmarshalText(%q) changed the kind to %d on error", bad, k)
		}
	}
}

func TestGroupJSON(t *testing.T) {
	id := hybridIdentity()
	id.Layout.Groups = append(id.Layout.Groups, Group{Kind: RecurrentState, Layers: []int{8}, BlockSize: 64, StateBytes: 4096})
	id.Layout.Layers = 9
	b, err := json.Marshal(id.Layout)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"layers":9,"kv_heads":8,"head_dim":128,"block_size":16,"tp_size":2,"replication":1,"groups":[` +
		`{"kind":"sliding_window","layers":[0,2,4,6],"block_size":16,"window":128},` +
		`{"kind":"full","layers":[1,3,5,7],"block_size":32},` +
		`{"kind":"state","layers":[8],"block_size":64,"state_bytes":4096}]}`
	if string(b) != want {
		t.Errorf("json.Marshal(layout) =\n%s\nwant\n%s", b, want)
	}
	var back Layout
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(id.Layout, back); diff != "" {
		t.Errorf("JSON round trip (-want +got):\n%s", diff)
	}
	// A layout without groups has no "groups" member.
	if b, _ := json.Marshal(validIdentity().Layout); bytes.Contains(b, []byte("groups")) {
		t.Errorf("json.Marshal of a layout without groups = %s", b)
	}
	err = json.Unmarshal([]byte(`{"groups":[{"kind":"mamba","layers":[0]}]}`), &back)
	if err == nil || !strings.Contains(err.Error(), `kind = "mamba": unknown group kind`) {
		t.Errorf("json.Unmarshal of kind mamba = %v, want an error naming it", err)
	}
}

func TestGroupsValidate(t *testing.T) {
	tests := []struct {
		name  string
		base  func() Identity
		edit  func(*Layout)
		field string // "" = valid
		value string
		want  string // substring of the error
	}{
		{"valid hybrid", hybridIdentity, func(*Layout) {}, "", "", ""},
		{"valid state", stateIdentity, func(*Layout) {}, "", "", ""},
		{"valid groups in any order", hybridIdentity, func(l *Layout) { l.Groups[0], l.Groups[1] = l.Groups[1], l.Groups[0] }, "", "", ""},
		{"valid largest window and state", stateIdentity, func(l *Layout) {
			l.Groups[0].StateBytes = 1 << 30
			l.Groups[1].Kind, l.Groups[1].Window = SlidingWindow, 1<<30
		}, "", "", ""},
		{"valid largest group block", hybridIdentity, func(l *Layout) { l.Groups[1].BlockSize = MaxBlockSize }, "", "", ""},
		{"valid explicit default", hybridIdentity, func(l *Layout) {
			l.Groups = []Group{{Kind: FullAttention, Layers: seqInts(8), BlockSize: 16}}
		}, "", "", ""},
		{"kind missing", hybridIdentity, func(l *Layout) { l.Groups[1].Kind = 0 }, "Layout.Groups[1].Kind", "0", "required: full (1), sliding_window (2) or state (3)"},
		{"kind unknown", hybridIdentity, func(l *Layout) { l.Groups[0].Kind, l.Groups[0].Window = 4, 0 }, "Layout.Groups[0].Kind", "4", "unknown group kind"},
		{"no layers", hybridIdentity, func(l *Layout) {
			l.Groups = append(l.Groups, Group{Kind: FullAttention, BlockSize: 16})
		}, "Layout.Groups[2].Layers", "[]", "empty: a group holds at least one layer"},
		{"layer out of range", hybridIdentity, func(l *Layout) { l.Groups[1].Layers = append(l.Groups[1].Layers, 8) }, "Layout.Groups[1].Layers[4]", "8", "outside [0, 8): Layout.Layers is 8"},
		{"negative layer", hybridIdentity, func(l *Layout) { l.Groups[0].Layers = append([]int{-1}, l.Groups[0].Layers...) }, "Layout.Groups[0].Layers[0]", "-1", "outside [0, 8)"},
		{"layer twice", hybridIdentity, func(l *Layout) { l.Groups[0].Layers = []int{0, 2, 2, 4, 6} }, "Layout.Groups[0].Layers[2]", "2", "not above the layer before it, 2"},
		{"layers out of order", hybridIdentity, func(l *Layout) { l.Groups[0].Layers = []int{0, 4, 2, 6} }, "Layout.Groups[0].Layers[2]", "2", "in increasing order"},
		{"layer in two groups", hybridIdentity, func(l *Layout) { l.Groups[1].Layers = []int{1, 2, 3, 5, 7} }, "Layout.Groups[1].Layers[1]", "2", "also in Layout.Groups[0]"},
		{"layer in no group", hybridIdentity, func(l *Layout) { l.Groups[1].Layers = []int{1, 3, 7} }, "Layout.Groups", "2 groups", "layer 5 of Layout.Layers 8 is in no group"},
		{"layers in no group", hybridIdentity, func(l *Layout) { l.Layers = 20 }, "Layout.Groups", "2 groups",
			"layers 8, 9, 10, 11, 12, 13, 14, 15, ... (12 in all) of Layout.Layers 20 are in no group"},
		{"block size 0", hybridIdentity, func(l *Layout) { l.Groups[1].BlockSize = 0 }, "Layout.Groups[1].BlockSize", "0", "must be 1 to 4096 tokens"},
		{"block size not a multiple", hybridIdentity, func(l *Layout) { l.Groups[1].BlockSize = 24 }, "Layout.Groups[1].BlockSize", "24", "not a multiple of Layout.BlockSize 16"},
		{"block size below the hash block size", hybridIdentity, func(l *Layout) { l.Groups[0].BlockSize = 8 }, "Layout.Groups[0].BlockSize", "8", "not a multiple of Layout.BlockSize 16"},
		{"block size over the largest", hybridIdentity, func(l *Layout) { l.Groups[1].BlockSize = MaxBlockSize + 16 }, "Layout.Groups[1].BlockSize", "4112", "must be 1 to 4096 tokens"},
		{"window 0", hybridIdentity, func(l *Layout) { l.Groups[0].Window = 0 }, "Layout.Groups[0].Window", "0", "must be 1 to 1073741824 tokens for a sliding-window group"},
		{"window negative", hybridIdentity, func(l *Layout) { l.Groups[0].Window = -128 }, "Layout.Groups[0].Window", "-128", "must be 1 to"},
		{"window over 2^30", hybridIdentity, func(l *Layout) { l.Groups[0].Window = 1<<30 + 1 }, "Layout.Groups[0].Window", "1073741825", "must be 1 to 1073741824"},
		{"window on a full group", hybridIdentity, func(l *Layout) { l.Groups[1].Window = 128 }, "Layout.Groups[1].Window", "128", "only a sliding_window group has a window; leave it 0 for a full group"},
		{"window on a state group", stateIdentity, func(l *Layout) { l.Groups[0].Window = 1 }, "Layout.Groups[0].Window", "1", "leave it 0 for a state group"},
		{"state bytes 0", stateIdentity, func(l *Layout) { l.Groups[0].StateBytes = 0 }, "Layout.Groups[0].StateBytes", "0", "must be 1 to 1073741824 bytes for a state group"},
		{"state bytes over 2^30", stateIdentity, func(l *Layout) { l.Groups[0].StateBytes = 1<<30 + 1 }, "Layout.Groups[0].StateBytes", "1073741825", "must be 1 to"},
		{"state bytes on a sliding group", hybridIdentity, func(l *Layout) { l.Groups[0].StateBytes = 64 }, "Layout.Groups[0].StateBytes", "64", "only a state group has state bytes; leave it 0 for a sliding_window group"},
		{"too many groups", validIdentity, func(l *Layout) {
			l.Layers = MaxGroups + 1
			for i := range l.Layers {
				l.Groups = append(l.Groups, Group{Kind: FullAttention, Layers: []int{i}, BlockSize: 16})
			}
		}, "Layout.Groups", "257 groups", "more than 256 (MaxGroups)"},
		{"all state, kv heads", allStateIdentity, func(l *Layout) { l.KVHeads = 2 }, "Layout.KVHeads", "2", "must be 1 when every group is a state group"},
		{"all state, head dim", allStateIdentity, func(l *Layout) { l.HeadDim = 64 }, "Layout.HeadDim", "64", "must be 1 when every group is a state group"},
		{"all state, replication", allStateIdentity, func(l *Layout) { l.Replication = 1 }, "Layout.Replication", "1", "must equal Layout.TPSize 2 when every group is a state group"},
		{"valid all state", allStateIdentity, func(*Layout) {}, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := tt.base()
			tt.edit(&id.Layout)
			err := id.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			checkFieldError(t, "Validate()", err, tt.field, tt.want)
			var fe *FieldError
			if errors.As(err, &fe) && fe.Value != tt.value {
				t.Errorf("Validate() value = %s, want %s (%v)", fe.Value, tt.value, err)
			}
			if b, err2 := id.MarshalBinary(); b != nil || err2 == nil {
				t.Errorf("MarshalBinary() = %x, %v; want an error", b, err2)
			}
			if err2 := new(Identity).UnmarshalBinary(refIdentityEncoding(id)); err2 == nil {
				t.Errorf("UnmarshalBinary of its encoding succeeds")
			}
		})
	}
}

// allStateIdentity is a valid identity of a model without attention: four
// state layers in two groups, over two ranks.
func allStateIdentity() Identity {
	id := validIdentity()
	id.Layout = Layout{Layers: 4, KVHeads: 1, HeadDim: 1, BlockSize: 16, TPSize: 2, Replication: 2, Groups: []Group{
		{Kind: RecurrentState, Layers: []int{0, 1}, BlockSize: 64, StateBytes: 1000},
		{Kind: RecurrentState, Layers: []int{2, 3}, BlockSize: 64, StateBytes: 1000},
	}}
	return id
}

// TestGroupsValidateBadLayout checks that groups do not add errors of their
// own to a layout whose layer count or block size is already invalid, and
// that Validate does not allocate by a huge layer count.
func TestGroupsValidateBadLayout(t *testing.T) {
	id := hybridIdentity()
	id.Layout.Layers, id.Layout.BlockSize = math.MaxInt32, 0
	err := id.Validate()
	for _, want := range []string{"Layout.Layers = 2147483647", "Layout.BlockSize = 0"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want an error containing %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "Layout.Groups") {
		t.Errorf("Validate() = %v, want no error of the groups", err)
	}
}

func TestEffectiveGroups(t *testing.T) {
	l := validIdentity().Layout
	want := []Group{{Kind: FullAttention, Layers: seqInts(32), BlockSize: 16}}
	if diff := cmp.Diff(want, l.EffectiveGroups()); diff != "" {
		t.Errorf("EffectiveGroups of a layout without groups (-want +got):\n%s", diff)
	}
	h := hybridIdentity().Layout
	gs := h.EffectiveGroups()
	if diff := cmp.Diff(h.Groups, gs); diff != "" {
		t.Errorf("EffectiveGroups of explicit groups (-want +got):\n%s", diff)
	}
	gs[0].Layers[0], gs[1].Window = 99, 7
	if h.Groups[0].Layers[0] != 0 || h.Groups[1].Window != 0 {
		t.Errorf("changing the result of EffectiveGroups changed the layout: %+v", h.Groups)
	}
}

// TestExplicitDefaultGroup checks the canonical form: a layout without
// groups and one with its one full-attention group of every layer at the
// hash block size are the same identity, while anything else is another.
func TestExplicitDefaultGroup(t *testing.T) {
	implicit := validIdentity()
	explicit := validIdentity()
	explicit.Layout.Groups = implicit.Layout.EffectiveGroups()
	a, err := implicit.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	b, err := explicit.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("encodings differ:\n%x\n%x", a, b)
	}
	nsA, _ := implicit.Namespace()
	nsB, _ := explicit.Namespace()
	if nsA != nsB {
		t.Errorf("namespaces differ: %v, %v", nsA, nsB)
	}
	if !implicit.Equal(explicit) || !explicit.Equal(implicit) {
		t.Error("the implicit and explicit default layouts are not Equal")
	}
	var back Identity
	if err := back.UnmarshalBinary(b); err != nil || back.Layout.Groups != nil {
		t.Errorf("UnmarshalBinary = %+v, %v; want Groups nil", back.Layout, err)
	}
	// Near misses are other identities.
	for name, edit := range map[string]func(*Group){
		"block size 2x": func(g *Group) { g.BlockSize = 32 },
		"sliding":       func(g *Group) { g.Kind, g.Window = SlidingWindow, 1<<30 },
	} {
		other := validIdentity()
		other.Layout.Groups = implicit.Layout.EffectiveGroups()
		edit(&other.Layout.Groups[0])
		ns, err := other.Namespace()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if ns == nsA || other.Equal(implicit) {
			t.Errorf("%s: the same identity as the default layout", name)
		}
	}
	split := validIdentity()
	split.Layout.Groups = []Group{
		{Kind: FullAttention, Layers: seqInts(16), BlockSize: 16},
		{Kind: FullAttention, Layers: seqInts(32)[16:], BlockSize: 16},
	}
	if ns, err := split.Namespace(); err != nil || ns == nsA {
		t.Errorf("two full groups: namespace %v, %v; want another than the default's", ns, err)
	}
}

func TestIdentityEqual(t *testing.T) {
	a, b := hybridIdentity(), hybridIdentity()
	if !a.Equal(b) {
		t.Error("equal hybrid identities are not Equal")
	}
	b.Layout.Groups[0].Layers = []int{0, 2, 4, 6}
	b.Layout.Groups[1].Window = 1
	if a.Equal(b) {
		t.Error("identities with different windows are Equal")
	}
	b = hybridIdentity()
	b.Layout.Groups[0], b.Layout.Groups[1] = b.Layout.Groups[1], b.Layout.Groups[0]
	if a.Equal(b) {
		t.Error("identities with their groups in another order are Equal")
	}
	b = hybridIdentity()
	b.Generation++
	if a.Equal(b) {
		t.Error("identities of different generations are Equal")
	}
	c := validIdentity()
	if c.Equal(a) || a.Equal(c) {
		t.Error("an identity without groups is Equal to a hybrid one")
	}
}

func TestGroupHashIndex(t *testing.T) {
	tests := []struct {
		blockSize, hashBlockSize int
		j, want                  int
	}{
		{16, 16, 0, 0}, {16, 16, 5, 5},
		{32, 16, 0, 1}, {32, 16, 1, 3}, {32, 16, 7, 15},
		{4096, 1, 0, 4095}, {4096, 1, 2, 12287},
		{1024, 256, 3, 15},
	}
	for _, tt := range tests {
		g := Group{Kind: FullAttention, Layers: []int{0}, BlockSize: tt.blockSize}
		if got := g.HashIndex(tt.j, tt.hashBlockSize); got != tt.want {
			t.Errorf("Group{BlockSize: %d}.HashIndex(%d, %d) = %d, want %d", tt.blockSize, tt.j, tt.hashBlockSize, got, tt.want)
		}
	}
	// Blocks counts the group blocks whose hash index is among n hashes.
	g := Group{Kind: SlidingWindow, Layers: []int{0}, BlockSize: 48, Window: 100}
	for n := range 20 {
		blocks := g.Blocks(n, 16)
		if want := n / 3; blocks != want {
			t.Errorf("Blocks(%d, 16) = %d, want %d", n, blocks, want)
		}
		// Every counted block's hash index is within the n hashes, and the
		// next block's is not.
		if blocks > 0 && g.HashIndex(blocks-1, 16) >= n || g.HashIndex(blocks, 16) < n {
			t.Errorf("n %d: Blocks %d, but HashIndex of the last is %d and of the next %d", n, blocks, g.HashIndex(blocks-1, 16), g.HashIndex(blocks, 16))
		}
	}
	mustPanic(t, "HashIndex of a hash block size that does not divide", "Group.HashIndex: hash block size 32 does not divide the group's block size 48",
		func() { g.HashIndex(0, 32) })
	mustPanic(t, "HashIndex(-1)", "Group.HashIndex: negative block -1", func() { g.HashIndex(-1, 16) })
	mustPanic(t, "HashIndex of hash block size 0", "hash block size 0 does not divide", func() { g.HashIndex(0, 0) })
	mustPanic(t, "Blocks(-1)", "Group.Blocks: negative hash count -1", func() { g.Blocks(-1, 16) })
	mustPanic(t, "Blocks of a group without a block size", "Group.Blocks: hash block size 16 does not divide the group's block size 0",
		func() { Group{}.Blocks(1, 16) })
}

// TestGroupBlockKeys follows SPEC.md's recipe for the keys of a group
// whose blocks are twice the hash block size: block j is named by hash
// (j+1)*2-1, the hash of the prefix that ends with the block's last token.
func TestGroupBlockKeys(t *testing.T) {
	id := hybridIdentity() // group 1: full attention in blocks of 32, hash blocks of 16
	ns, err := id.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	tokens := seq(100)
	hashes, err := HashBlocks(ns.BlockSize(), tokens)
	if err != nil {
		t.Fatal(err)
	}
	g := ns.Groups()[1]
	if n := g.Blocks(len(hashes), ns.BlockSize()); n != 3 {
		t.Fatalf("Blocks(%d hashes) = %d, want 3 (100 tokens, blocks of 32)", len(hashes), n)
	}
	for j := range 3 {
		// The prefix up to the end of group block j, hashed on its own,
		// ends with the same hash.
		prefix, _ := HashBlocks(ns.BlockSize(), tokens[:(j+1)*g.BlockSize])
		i := g.HashIndex(j, ns.BlockSize())
		if i != len(prefix)-1 || hashes[i] != prefix[len(prefix)-1] {
			t.Errorf("block %d: HashIndex %d, prefix of %d hashes", j, i, len(prefix))
		}
		key := ns.GroupKey(1, ns.GroupShard(1, 1), hashes[i])
		if k, err := ParseKey(key); err != nil || k.Group != 1 || k.Hash != prefix[len(prefix)-1] {
			t.Errorf("block %d: key %q parses to %+v, %v", j, key, k, err)
		}
	}
}
