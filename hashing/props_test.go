package hashing

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// The properties are written as check functions over an implementation, so
// that each can be shown to catch a deliberately broken one (the Harness
// tests at the end) as well as run against this package under rapid.

// failer is the part of *rapid.T and of the recorder that checks use.
type failer interface {
	Fatalf(format string, args ...any)
}

// recorder is a failer that remembers whether it failed.
type recorder struct {
	failed bool
	msg    string
}

func (r *recorder) Fatalf(format string, args ...any) {
	if !r.failed {
		r.failed, r.msg = true, fmt.Sprintf(format, args...)
	}
}

// appender is what the checks need of a chain.
type appender interface {
	Append(dst []BlockHash, tokens ...Token) []BlockHash
}

// oneShot hashes tokens in one call.
type oneShot func(n int, tokens []Token, extras ...Extra) ([]BlockHash, error)

// checkIncremental appends tokens to a fresh chain in the pieces that cuts
// (sorted offsets) give and compares the concatenated results with a
// one-shot hash.
func checkIncremental(t failer, newChain func() appender, hash func([]Token) []BlockHash, tokens []Token, cuts []int) {
	c := newChain()
	var got []BlockHash
	prev := 0
	for _, cut := range append(cuts, len(tokens)) {
		got = c.Append(got, tokens[prev:cut]...)
		prev = cut
	}
	if want := hash(tokens); !slices.Equal(got, want) {
		t.Fatalf("appending %d tokens in pieces cut at %v gave %d hashes %v, one shot %d hashes %v", len(tokens), cuts, len(got), got, len(want), want)
	}
}

// checkPrefix checks that the hashes of prefix are a prefix of those of
// prefix+more.
func checkPrefix(t failer, hash func([]Token) []BlockHash, prefix, more []Token) {
	a := hash(prefix)
	b := hash(append(slices.Clone(prefix), more...))
	if len(b) < len(a) || !slices.Equal(a, b[:len(a)]) {
		t.Fatalf("hashes of %d tokens %v are not a prefix of those of %d tokens %v", len(prefix), a, len(prefix)+len(more), b)
	}
}

// checkExtrasDiffer checks that two different extras give different hashes
// of the same tokens.
func checkExtrasDiffer(t failer, hash func(Extra) BlockHash, a, b Extra) {
	if ha, hb := hash(a), hash(b); ha == hb {
		t.Fatalf("%v and %v give the same hash %v", a, b, ha)
	}
}

// checkNamespacesDiffer checks that two different identities have different
// namespace IDs.
func checkNamespacesDiffer(t failer, ns func(Identity) string, a, b Identity) {
	if na, nb := ns(a), ns(b); na == nb {
		t.Fatalf("identities %+v and %+v have the same namespace %s", a, b, na)
	}
}

// The properties under rapid.

func packageHash(t *rapid.T, n int, extras []Extra) func([]Token) []BlockHash {
	return func(tokens []Token) []BlockHash {
		h, err := HashBlocks(n, tokens, extras...)
		if err != nil {
			t.Fatalf("HashBlocks: %v", err)
		}
		return h
	}
}

func TestPropIncrementalEqualsOneShot(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := genBlockSize().Draw(t, "blockSize")
		tokens := genTokens(4*n).Draw(t, "tokens")
		extras := extrasOf(genExtras(len(tokens)).Draw(t, "extras"))
		cuts := rapid.SliceOfN(rapid.IntRange(0, len(tokens)), 0, 8).Draw(t, "cuts")
		slices.Sort(cuts)
		newChain := func() appender {
			c, err := NewChain(n, extras...)
			if err != nil {
				t.Fatalf("NewChain: %v", err)
			}
			return c
		}
		checkIncremental(t, newChain, packageHash(t, n, extras), tokens, cuts)
	})
}

// TestIncrementalEverySplit checks every split point of one sequence, and
// every split into single tokens, for a direct and a split block size.
func TestIncrementalEverySplit(t *testing.T) {
	for _, n := range []int{7, 130} {
		tokens := benchTokens(3*n + 2)
		hash := func(tok []Token) []BlockHash { h, _ := HashBlocks(n, tok, CacheSalt("s")); return h }
		newChain := func() appender { c, _ := NewChain(n, CacheSalt("s")); return c }
		for cut := 0; cut <= len(tokens); cut++ {
			checkIncremental(t, newChain, hash, tokens, []int{cut})
		}
		every := make([]int, len(tokens))
		for i := range every {
			every[i] = i
		}
		checkIncremental(t, newChain, hash, tokens, every)
	}
}

func TestPropPrefix(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := genBlockSize().Draw(t, "blockSize")
		prefix := genTokens(3*n).Draw(t, "prefix")
		more := genTokens(3*n).Draw(t, "more")
		extras := extrasOf(genExtras(len(prefix)+len(more)).Draw(t, "extras"))
		checkPrefix(t, packageHash(t, n, extras), prefix, more)
	})
}

// genExtra draws one valid extra of the given kind from small alphabets, so
// that values of different kinds often share their bytes.
func genExtra(kind string) *rapid.Generator[Extra] {
	return rapid.Custom(func(t *rapid.T) Extra {
		s := rapid.StringOfN(rapid.RuneFrom([]rune("ab\x00\x21\x22\x23")), 1, 5, -1)
		switch kind {
		case "cache_salt":
			return CacheSalt(s.Draw(t, "salt"))
		case "adapter":
			return Adapter(s.Draw(t, "name"), genHash32().Draw(t, "fingerprint"))
		case "opaque":
			return Opaque(s.Draw(t, "tag"), []byte(rapid.StringN(0, 5, -1).Draw(t, "data")))
		default:
			return MultiModal(genHash32().Draw(t, "content"), rapid.IntRange(0, 20).Draw(t, "offset"), rapid.IntRange(1, 20).Draw(t, "length"))
		}
	})
}

func TestPropExtrasDiffer(t *testing.T) {
	kinds := []string{"cache_salt", "adapter", "opaque", "multimodal"}
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.SampledFrom([]int{1, 16, 129}).Draw(t, "blockSize")
		tokens := genTokens(2*n).Filter(func(tok []Token) bool { return len(tok) >= n }).Draw(t, "tokens")
		ka := rapid.SampledFrom(kinds).Draw(t, "kind a")
		kb := rapid.SampledFrom(kinds).Draw(t, "kind b")
		a := genExtra(ka).Draw(t, "a")
		b := genExtra(kb).Draw(t, "b")
		if a == b {
			t.Skip("equal extras")
		}
		hash := func(e Extra) BlockHash {
			h := packageHash(t, n, []Extra{e})(tokens)
			return h[len(h)-1]
		}
		if hashed := len(tokens) / n * n; ka == "multimodal" && a.off >= int64(hashed) || kb == "multimodal" && b.off >= int64(hashed) {
			t.Skip("an item beyond the hashed blocks binds nothing yet")
		}
		checkExtrasDiffer(t, hash, a, b)
	})
}

// mutateIdentity changes field i (0 to identityFields-1) of id to another
// valid value.
const identityFields = 16

func mutateIdentity(t *rapid.T, id Identity, i int) Identity {
	other := func(s string) string { return s + rapid.SampledFrom([]string{"x", "0", "_"}).Draw(t, "suffix") }
	otherDType := func(d DType) DType {
		return rapid.SampledFrom(DTypes()).Filter(func(x DType) bool { return x != d }).Draw(t, "dtype")
	}
	switch i {
	case 0:
		id.Tenant = other(id.Tenant)
	case 1:
		id.Model = other(id.Model)
	case 2:
		id.WeightsVersion = other(id.WeightsVersion)
	case 3:
		id.Generation++
	case 4:
		id.Format.Device = other(id.Format.Device)
	case 5:
		id.Format.ModelDType = otherDType(id.Format.ModelDType)
	case 6:
		id.Format.KVDType = otherDType(id.Format.KVDType)
	case 7:
		id.Format.KVQuant = other(id.Format.KVQuant)
	case 8:
		if id.Format.MLADType == "" {
			// MLA needs one KV head held by every rank.
			id.Layout.KVHeads, id.Layout.Replication = 1, id.Layout.TPSize
		}
		id.Format.MLADType = otherDType(id.Format.MLADType)
	case 9:
		if l := &id.Layout; len(l.Groups) > 0 {
			// One more layer, in the first group: every layer stays in one.
			if l.Layers == maxLayoutValue {
				t.Skip("the most layers")
			}
			l.Groups = l.EffectiveGroups()
			l.Groups[0].Layers = append(l.Groups[0].Layers, l.Layers)
			l.Layers++
			break
		}
		id.Layout.Layers = id.Layout.Layers%maxLayoutValue + 1
	case 10:
		if id.Format.MLADType != "" {
			t.Skip("MLA has exactly one KV head")
		}
		if id.Layout.allState() {
			t.Skip("a layout of state groups has one KV head")
		}
		id.Layout.KVHeads *= 2
	case 11:
		if id.Layout.allState() {
			t.Skip("a layout of state groups has head dim 1")
		}
		id.Layout.HeadDim = id.Layout.HeadDim%maxLayoutValue + 1
	case 12:
		if len(id.Layout.Groups) > 0 {
			// The groups' block sizes stay multiples of the hash block size.
			if id.Layout.BlockSize == 1 {
				t.Skip("no other hash block size divides the groups' block sizes")
			}
			id.Layout.BlockSize = 1
			break
		}
		id.Layout.BlockSize = id.Layout.BlockSize%MaxBlockSize + 1
	case 13:
		id.Layout.TPSize *= 2
		id.Layout.Replication *= 2
	case 14:
		if id.Format.MLADType != "" {
			t.Skip("MLA has exactly one KV head, and Replication = TPSize")
		}
		if id.Layout.allState() {
			t.Skip("a layout of state groups has one KV head, and Replication = TPSize")
		}
		id.Layout.KVHeads *= 2
		id.Layout.TPSize *= 2
	case 15:
		id.Layout = mutateGroups(t, id.Layout)
	}
	return id
}

// mutateGroups changes the KV cache groups of l into other valid ones, of
// another identity.
func mutateGroups(t *rapid.T, l Layout) Layout {
	if l.isDefaultGroups() {
		gs := l.EffectiveGroups()
		if l.Layers == 1 || rapid.Bool().Draw(t, "one sliding group?") {
			gs[0].Kind, gs[0].Window = SlidingWindow, 1+rapid.IntRange(0, 9).Draw(t, "window")
		} else {
			// Two groups: the last layer becomes a sliding-window group.
			gs = append(gs, Group{Kind: SlidingWindow, Layers: []int{l.Layers - 1}, BlockSize: l.BlockSize, Window: 128})
			gs[0].Layers = gs[0].Layers[:l.Layers-1]
		}
		l.Groups = gs
		return l
	}
	gs := l.EffectiveGroups()
	i := rapid.IntRange(0, len(gs)-1).Draw(t, "group")
	g := &gs[i]
	switch rapid.IntRange(0, 4).Draw(t, "group mutation") {
	case 0: // the other attention kind, or other state bytes
		switch g.Kind {
		case FullAttention:
			g.Kind, g.Window = SlidingWindow, 4096
		case SlidingWindow:
			g.Kind, g.Window = FullAttention, 0
		default:
			g.StateBytes = g.StateBytes%maxStateBytes + 1
		}
	case 1: // another window, or other state bytes
		switch g.Kind {
		case SlidingWindow:
			g.Window = g.Window%maxWindow + 1
		case RecurrentState:
			g.StateBytes = g.StateBytes%maxStateBytes + 1
		default:
			g.Kind, g.Window = SlidingWindow, 1
		}
	case 2: // another block size
		if g.BlockSize+l.BlockSize <= MaxBlockSize {
			g.BlockSize += l.BlockSize
		} else {
			g.BlockSize = l.BlockSize
		}
		if g.BlockSize == gs[i].BlockSize {
			t.Skip("no other block size")
		}
	case 3: // two groups swapped
		if len(gs) < 2 {
			t.Skip("one group")
		}
		j := (i + 1) % len(gs)
		gs[i], gs[j] = gs[j], gs[i]
	case 4: // a layer moved to another group
		if len(gs) < 2 || len(g.Layers) < 2 {
			t.Skip("no layer to move")
		}
		j := (i + 1) % len(gs)
		layer := g.Layers[len(g.Layers)-1]
		g.Layers = g.Layers[:len(g.Layers)-1]
		gs[j].Layers = append(gs[j].Layers, layer)
		slices.Sort(gs[j].Layers)
	}
	l.Groups = gs
	if l.isDefaultGroups() {
		t.Skip("the mutation gave the default layout") // the block size mutation of one full group can
	}
	return l
}

func TestPropIdentityFieldsChangeNamespace(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := genIdentity().Draw(t, "identity")
		b := mutateIdentity(t, a, rapid.IntRange(0, identityFields-1).Draw(t, "field"))
		if a.Equal(b) {
			t.Fatalf("mutation left the identity unchanged")
		}
		if err := b.Validate(); err != nil {
			t.Fatalf("mutated identity is invalid: %v", err)
		}
		ns := func(id Identity) string {
			n, err := id.Namespace()
			if err != nil {
				t.Fatalf("Namespace: %v", err)
			}
			return n.ID()
		}
		checkNamespacesDiffer(t, ns, a, b)
	})
}

// The checks catch broken implementations.

func TestHarnessCatchesUntaggedExtras(t *testing.T) {
	// A seed over the extras' raw bytes, without kind tags or length
	// prefixes, the way string extra keys were once concatenated.
	naive := func(e Extra) BlockHash {
		return blake3Sum([]byte(e.s1 + e.s2))
	}
	var r recorder
	checkExtrasDiffer(&r, naive, CacheSalt("ab"), Opaque("a", []byte("b")))
	if !r.failed {
		t.Error("checkExtrasDiffer missed a salt and an opaque extra that share their bytes")
	}
	r = recorder{}
	checkExtrasDiffer(&r, func(e Extra) BlockHash { h, _ := HashBlocks(4, seq(4), e); return h[0] }, CacheSalt("ab"), Opaque("a", []byte("b")))
	if r.failed {
		t.Errorf("the package failed the check: %s", r.msg)
	}
}

// forgetful drops the partial block at the end of every Append.
type forgetful struct{ *Chain }

func (f forgetful) Append(dst []BlockHash, tokens ...Token) []BlockHash {
	dst = f.Chain.Append(dst, tokens...)
	f.Chain.npend = 0
	return dst
}

func TestHarnessCatchesForgottenPartialBlock(t *testing.T) {
	hash := func(tok []Token) []BlockHash { h, _ := HashBlocks(4, tok); return h }
	var r recorder
	checkIncremental(&r, func() appender { c, _ := NewChain(4); return forgetful{c} }, hash, seq(12), []int{6})
	if !r.failed {
		t.Error("checkIncremental missed a chain that forgets the partial block")
	}
	r = recorder{}
	checkIncremental(&r, func() appender { c, _ := NewChain(4); return c }, hash, seq(12), []int{6})
	if r.failed {
		t.Errorf("the package failed the check: %s", r.msg)
	}
}

func TestHarnessCatchesLengthDependentHashes(t *testing.T) {
	// A chain whose seed depends on the request's total length is not
	// prefix-stable.
	broken := func(tok []Token) []BlockHash {
		h, _ := HashBlocks(4, tok, Opaque("len", []byte{byte(len(tok))}))
		return h
	}
	var r recorder
	checkPrefix(&r, broken, seq(8), seq(4))
	if !r.failed {
		t.Error("checkPrefix missed hashes that depend on the total length")
	}
}

func TestHarnessCatchesIgnoredField(t *testing.T) {
	// A namespace that leaves out the generation, like keys that name only
	// the model: rotation would not change it.
	noGeneration := func(id Identity) string {
		id.Generation = 0
		ns, _ := id.Namespace()
		return ns.ID()
	}
	a := validIdentity()
	var r recorder
	checkNamespacesDiffer(&r, noGeneration, a, a.Rotate())
	if !r.failed {
		t.Error("checkNamespacesDiffer missed a namespace without the generation")
	}
}
