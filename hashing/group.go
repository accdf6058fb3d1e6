package hashing

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
)

// GroupKind is how the layers of a KV cache [Group] keep what a request
// has seen so far. Its text form (JSON, SPEC.md) is "full",
// "sliding_window" or "state"; the zero GroupKind is no kind, and
// [Identity.Validate] rejects it.
type GroupKind uint8

// The kinds of KV cache groups, as vLLM's hybrid memory allocator has them
// (FullAttentionSpec, SlidingWindowSpec, MambaSpec). The values are the
// kind bytes of the identity encoding.
const (
	// FullAttention layers keep the K and V of every token; attention reads
	// all of them. A block holds the KV of its tokens.
	FullAttention GroupKind = 1
	// SlidingWindow layers keep the K and V of every token too, but
	// attention reads only the last [Group].Window tokens, so only the
	// blocks that overlap the window before a position are needed to
	// resume there (gpt-oss, Gemma 2 and 3, Mistral).
	SlidingWindow GroupKind = 2
	// RecurrentState layers keep one fixed-size state per request, updated
	// token by token: Mamba and other state space layers, linear attention
	// (Qwen3-Next, Jamba, Nemotron-H, MiniMax). Block j of such a group
	// holds the state after the tokens of blocks 0 to j, not KV of its own
	// tokens, and each TP rank holds its own part of it (see
	// [Namespace.GroupShard]).
	RecurrentState GroupKind = 3
)

// String returns the kind's text form, or "GroupKind(n)" for a kind that
// has none.
func (k GroupKind) String() string {
	switch k {
	case FullAttention:
		return "full"
	case SlidingWindow:
		return "sliding_window"
	case RecurrentState:
		return "state"
	}
	return fmt.Sprintf("GroupKind(%d)", uint8(k))
}

// Known reports whether k is one of FullAttention, SlidingWindow and
// RecurrentState.
func (k GroupKind) Known() bool { return k >= FullAttention && k <= RecurrentState }

// MarshalText returns the kind's text form: "full", "sliding_window" or
// "state". A kind that is not [GroupKind.Known] has none, and is an error.
func (k GroupKind) MarshalText() ([]byte, error) {
	if !k.Known() {
		return nil, &FieldError{Field: "kind", Value: fmt.Sprint(uint8(k)), Reason: groupKindHint}
	}
	return []byte(k.String()), nil
}

// UnmarshalText parses exactly "full", "sliding_window" or "state"
// (lower case, nothing around them); anything else is a [*FieldError].
func (k *GroupKind) UnmarshalText(b []byte) error {
	for _, v := range [...]GroupKind{FullAttention, SlidingWindow, RecurrentState} {
		if string(b) == v.String() {
			*k = v
			return nil
		}
	}
	return &FieldError{Field: "kind", Value: quoteTrunc(string(b)), Reason: groupKindHint}
}

const groupKindHint = "unknown group kind (known: full, sliding_window, state)"

// Group is one KV cache group of a hybrid model: layers of one kind that
// share a block size, and so one block table in the engine (vLLM's
// KVCacheGroupSpec). Each group has its own store keys
// ([Namespace.GroupKey]); a prefix is present for a request only when
// every group has what it needs of it.
//
// Block j of a group covers the tokens [j×BlockSize, (j+1)×BlockSize) and
// is named by the chain hash that ends with its last token:
// [Group.HashIndex].
type Group struct {
	// Kind is the kind of the group's layers; required.
	Kind GroupKind `json:"kind"`
	// Layers are the group's layers, as indices in [0, Layout.Layers), in
	// strictly increasing order: a stored block of the group holds their
	// KV (or state) in this order. Every layer of the layout is in exactly
	// one group.
	Layers []int `json:"layers"`
	// BlockSize is the group's block size in tokens: a multiple of
	// Layout.BlockSize, the block size of the hash chain, and at most
	// [MaxBlockSize].
	BlockSize int `json:"block_size"`
	// Window is the sliding window in tokens, 1 to 2^30, as the model's
	// configuration gives it (vLLM's SlidingWindowSpec.sliding_window):
	// for SlidingWindow groups only, 0 for the others.
	Window int `json:"window,omitempty"`
	// StateBytes is the size in bytes of one state of one layer in one
	// shard, 1 to 2^30: for RecurrentState groups only, 0 for the others.
	StateBytes int `json:"state_bytes,omitempty"`
}

// HashIndex returns the index, in a request's chain of hashBlockSize-token
// blocks, of the hash that names block j of g: (j+1)×k−1 with k =
// g.BlockSize / hashBlockSize, the hash of the chain's prefix that ends
// with the group block's last token. Pass ns.BlockSize() as hashBlockSize;
// then ns.GroupKey(group, shard, hashes[g.HashIndex(j, ns.BlockSize())])
// is the key of block j. HashIndex panics unless j >= 0 and hashBlockSize
// is positive and divides g.BlockSize, as it does in a valid identity.
func (g Group) HashIndex(j, hashBlockSize int) int {
	k := g.ratio("HashIndex", hashBlockSize)
	if j < 0 {
		panic(fmt.Sprintf("hashing: Group.HashIndex: negative block %d", j))
	}
	return (j+1)*k - 1
}

// Blocks returns how many whole blocks of g the first n hashes of a chain
// of hashBlockSize-token blocks cover: n / k with k = g.BlockSize /
// hashBlockSize. The key of each of them uses the hash at
// [Group.HashIndex]. Blocks panics like HashIndex, and for a negative n.
func (g Group) Blocks(n, hashBlockSize int) int {
	k := g.ratio("Blocks", hashBlockSize)
	if n < 0 {
		panic(fmt.Sprintf("hashing: Group.Blocks: negative hash count %d", n))
	}
	return n / k
}

func (g Group) ratio(fn string, hashBlockSize int) int {
	if hashBlockSize < 1 || g.BlockSize < 1 || g.BlockSize%hashBlockSize != 0 {
		panic(fmt.Sprintf("hashing: Group.%s: hash block size %d does not divide the group's block size %d", fn, hashBlockSize, g.BlockSize))
	}
	return g.BlockSize / hashBlockSize
}

// MaxGroups is the most KV cache groups a [Layout] may have.
const MaxGroups = 256

// Limits of a group's fields.
const (
	maxWindow     = 1 << 30
	maxStateBytes = 1 << 30
)

// EffectiveGroups returns the layout's KV cache groups in their explicit
// form: a copy of l.Groups, or for a layout without groups the one group
// that it means, full attention over every layer at l.BlockSize. Both forms
// are the same identity, with one encoding and one namespace (SPEC.md,
// "KV cache groups"). The result is the caller's to modify.
func (l Layout) EffectiveGroups() []Group {
	if len(l.Groups) == 0 {
		layers := make([]int, max(l.Layers, 0))
		for i := range layers {
			layers[i] = i
		}
		return []Group{{Kind: FullAttention, Layers: layers, BlockSize: l.BlockSize}}
	}
	gs := slices.Clone(l.Groups)
	for i := range gs {
		gs[i].Layers = slices.Clone(gs[i].Layers)
	}
	return gs
}

// isDefaultGroups reports whether l's groups are the default layout's: none,
// or the one full-attention group of every layer at the hash block size.
func (l Layout) isDefaultGroups() bool {
	switch len(l.Groups) {
	case 0:
		return true
	case 1:
		g := l.Groups[0]
		if g.Kind != FullAttention || g.BlockSize != l.BlockSize || g.Window != 0 || g.StateBytes != 0 || len(g.Layers) != l.Layers {
			return false
		}
		for i, layer := range g.Layers {
			if layer != i {
				return false
			}
		}
		return true
	}
	return false
}

// allState reports whether l has groups and every one of them is a
// RecurrentState group: a model without attention layers.
func (l Layout) allState() bool {
	for _, g := range l.Groups {
		if g.Kind != RecurrentState {
			return false
		}
	}
	return len(l.Groups) > 0
}

// Equal reports whether id and other are the same identity: equal in every
// field, with their groups compared in the explicit form of
// [Layout.EffectiveGroups]. Equal valid identities have the same encoding
// and namespace. (An Identity is not comparable with ==, since
// Layout.Groups is a slice.)
func (id Identity) Equal(other Identity) bool {
	a, b := id.Layout, other.Layout
	if a.isDefaultGroups() && b.isDefaultGroups() {
		a.Groups, b.Groups = nil, nil
	}
	if !slices.EqualFunc(a.Groups, b.Groups, func(x, y Group) bool {
		return x.Kind == y.Kind && x.BlockSize == y.BlockSize && x.Window == y.Window &&
			x.StateBytes == y.StateBytes && slices.Equal(x.Layers, y.Layers)
	}) {
		return false
	}
	id.Layout.Groups, other.Layout.Groups = nil, nil
	return id.compare() == other.compare()
}

// comparableIdentity is an Identity without its groups.
type comparableIdentity struct {
	tenant, model, weights string
	generation             uint64
	format                 Format
	layers, heads, dim     int
	block, tp, repl        int
}

func (id Identity) compare() comparableIdentity {
	l := id.Layout
	return comparableIdentity{id.Tenant, id.Model, id.WeightsVersion, id.Generation, id.Format,
		l.Layers, l.KVHeads, l.HeadDim, l.BlockSize, l.TPSize, l.Replication}
}

// groupCount is the value shown in errors about Layout.Groups as a whole.
func groupCount(n int) raw {
	if n == 1 {
		return "1 group"
	}
	return raw(fmt.Sprintf("%d groups", n))
}

// checkGroups adds the errors of l.Groups. layersOK and blockOK say whether
// l.Layers and l.BlockSize are valid, so that the checks that depend on
// them can run.
func checkGroups(l Layout, layersOK, blockOK bool, add func(error)) {
	gs := l.Groups
	if len(gs) == 0 {
		return
	}
	if len(gs) > MaxGroups {
		add(fieldErr("Layout.Groups", groupCount(len(gs)), "more than %d (MaxGroups)", MaxGroups))
		return
	}
	var owner []uint16 // owner[layer] = 1 + the group that holds it
	if layersOK {
		owner = make([]uint16, l.Layers)
	}
	covered := 0
	for i, g := range gs {
		f := fmt.Sprintf("Layout.Groups[%d]", i)
		known := g.Kind.Known()
		if !known {
			why := "unknown group kind"
			if g.Kind == 0 {
				why = "required"
			}
			add(fieldErr(f+".Kind", uint8(g.Kind), "%s: full (%d), sliding_window (%d) or state (%d)", why, FullAttention, SlidingWindow, RecurrentState))
		}
		if len(g.Layers) == 0 {
			add(fieldErr(f+".Layers", raw("[]"), "empty: a group holds at least one layer"))
		}
		reported := false // one error of a group's layers is enough
		for k, layer := range g.Layers {
			var err error
			switch lf := func() string { return fmt.Sprintf("%s.Layers[%d]", f, k) }; {
			case reported:
			case k > 0 && layer <= g.Layers[k-1]:
				err = fieldErr(lf(), layer, "not above the layer before it, %d: list a group's layers once each, in increasing order", g.Layers[k-1])
			case layer < 0 || layersOK && layer >= l.Layers:
				err = fieldErr(lf(), layer, "outside [0, %d): Layout.Layers is %d", max(l.Layers, 0), l.Layers)
			case layersOK && owner[layer] != 0 && int(owner[layer]) != i+1:
				err = fieldErr(lf(), layer, "also in Layout.Groups[%d]: each layer is in exactly one group", owner[layer]-1)
			}
			if err != nil {
				add(err)
				reported = true
			}
			if layersOK && 0 <= layer && layer < l.Layers && owner[layer] == 0 {
				owner[layer] = uint16(i + 1)
				covered++
			}
		}
		switch {
		case g.BlockSize < 1 || g.BlockSize > MaxBlockSize:
			add(fieldErr(f+".BlockSize", g.BlockSize, "must be 1 to %d tokens, a multiple of Layout.BlockSize", MaxBlockSize))
		case blockOK && g.BlockSize%l.BlockSize != 0:
			add(fieldErr(f+".BlockSize", g.BlockSize, "not a multiple of Layout.BlockSize %d, the block size of the hash chain", l.BlockSize))
		}
		if !known {
			continue
		}
		switch {
		case g.Kind == SlidingWindow && (g.Window < 1 || g.Window > maxWindow):
			add(fieldErr(f+".Window", g.Window, "must be 1 to %d tokens for a sliding-window group", maxWindow))
		case g.Kind != SlidingWindow && g.Window != 0:
			add(fieldErr(f+".Window", g.Window, "only a sliding_window group has a window; leave it 0 for a %s group", g.Kind))
		}
		switch {
		case g.Kind == RecurrentState && (g.StateBytes < 1 || g.StateBytes > maxStateBytes):
			add(fieldErr(f+".StateBytes", g.StateBytes, "must be 1 to %d bytes for a state group", maxStateBytes))
		case g.Kind != RecurrentState && g.StateBytes != 0:
			add(fieldErr(f+".StateBytes", g.StateBytes, "only a state group has state bytes; leave it 0 for a %s group", g.Kind))
		}
	}
	if layersOK && covered < l.Layers {
		var missing []string
		for layer, o := range owner {
			if o == 0 && len(missing) < 8 {
				missing = append(missing, fmt.Sprint(layer))
			}
		}
		if n := l.Layers - covered; n > len(missing) {
			missing = append(missing, fmt.Sprintf("... (%d in all)", n))
		}
		what := "layers " + strings.Join(missing, ", ") + " of Layout.Layers %d are"
		if len(missing) == 1 {
			what = "layer " + missing[0] + " of Layout.Layers %d is"
		}
		add(fieldErr("Layout.Groups", groupCount(len(gs)),
			what+" in no group: every layer must be in exactly one", l.Layers))
	}
}

// appendGroups writes the groups of the identity encoding: their count,
// then each group. The default layout (see [Layout.EffectiveGroups]) has
// count 0, whether its Groups is empty or explicit.
func appendGroups(b []byte, l Layout) []byte {
	if l.isDefaultGroups() {
		return appendU32(b, 0)
	}
	b = appendU32(b, uint32(len(l.Groups)))
	for _, g := range l.Groups {
		b = append(b, byte(g.Kind))
		b = appendU32(b, uint32(g.BlockSize))
		b = appendU32(b, uint32(g.Window))
		b = appendU32(b, uint32(g.StateBytes))
		b = appendU32(b, uint32(len(g.Layers)))
		for _, layer := range g.Layers {
			b = appendU32(b, uint32(layer))
		}
	}
	return b
}

// groups reads the groups of the identity encoding, with the limits of
// validation: at most MaxGroups groups and 65536 layers in all, each value
// below 2^31. It returns nil for count 0.
func (d *decoder) groups() []Group {
	n := d.u32("Layout.Groups count")
	if d.err == nil && n > MaxGroups {
		d.fail("Layout.Groups: %d groups, more than %d (MaxGroups)", n, MaxGroups)
	}
	if d.err != nil || n == 0 {
		return nil
	}
	gs := make([]Group, 0, n)
	left := uint32(maxLayoutValue) // layers in all groups together
	for i := 0; i < int(n) && d.err == nil; i++ {
		f := fmt.Sprintf("Layout.Groups[%d]", i)
		var g Group
		g.Kind = GroupKind(d.byte(f + ".Kind"))
		g.BlockSize = d.int(f + ".BlockSize")
		g.Window = d.int(f + ".Window")
		g.StateBytes = d.int(f + ".StateBytes")
		count := d.u32(f + ".Layers count")
		switch {
		case d.err != nil:
		case count > left:
			d.fail("%s.Layers: %d layers, more than the %d left of %d in all groups", f, count, left, maxLayoutValue)
		case uint64(count)*4 > uint64(len(d.b)):
			d.fail("%s.Layers: truncated: %d layers need %d bytes, %d left", f, count, uint64(count)*4, len(d.b))
		}
		if d.err != nil {
			break
		}
		left -= count
		start := d.off
		p := d.take(f+".Layers", int(count)*4)
		g.Layers = make([]int, count)
		for k := range g.Layers {
			v := binary.LittleEndian.Uint32(p[4*k:])
			if v > math.MaxInt32 {
				d.off = start + 4*k
				d.fail("%s.Layers[%d]: %d out of range", f, k, v)
				break
			}
			g.Layers[k] = int(v)
		}
		gs = append(gs, g)
	}
	return gs
}
