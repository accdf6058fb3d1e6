package hashing

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

func seq(n int) []Token {
	t := make([]Token, n)
	for i := range t {
		t[i] = Token(i)
	}
	return t
}

func TestChainMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := genBlockSize().Draw(t, "blockSize")
		tokens := genTokens(4*n).Draw(t, "tokens")
		extras := genExtras(len(tokens)).Draw(t, "extras")
		c, err := NewChain(n, extrasOf(extras)...)
		if err != nil {
			t.Fatalf("NewChain: %v", err)
		}
		got := c.Append(nil, tokens...)
		seed, steps := refChain(n, tokens, extras)
		if BlockHash(seed) != c.seed {
			t.Fatalf("seed = %v, want %v", c.seed, BlockHash(seed))
		}
		var want []BlockHash
		for _, s := range steps {
			want = append(want, s.hash)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("hashes (-want +got):\n%s", diff)
		}
	})
}

func TestNewChainErrors(t *testing.T) {
	var h1, h2 [32]byte
	h1[0], h2[0] = 1, 2
	tests := []struct {
		name      string
		blockSize int
		extras    []Extra
		field     string // the FieldError's field
		value     string // the FieldError's value
	}{
		{"block size 0", 0, nil, "blockSize", "0"},
		{"block size negative", -16, nil, "blockSize", "-16"},
		{"block size too big", MaxBlockSize + 1, nil, "blockSize", "4097"},
		{"zero extra", 16, []Extra{{}}, "extras[0]", "Extra{}"},
		{"empty salt", 16, []Extra{CacheSalt("")}, "extras[0] (cache salt).salt", `""`},
		{"two salts", 16, []Extra{CacheSalt("a"), CacheSalt("b")}, "extras[1] (cache salt).salt", `"b"`},
		{"salt too long", 16, []Extra{CacheSalt(strings.Repeat("x", MaxExtraLen+1))}, "extras[0] (cache salt).salt", ""},
		{"adapter without name", 16, []Extra{Adapter("", h1)}, "extras[0] (adapter).name", `""`},
		{"adapter zero fingerprint", 16, []Extra{Adapter("lora", [32]byte{})}, "extras[0] (adapter).fingerprint", strings.Repeat("0", 64)},
		{"two adapters", 16, []Extra{Adapter("a", h1), Adapter("b", h2)}, "extras[1] (adapter).name", `"b"`},
		{"opaque without tag", 16, []Extra{Opaque("", nil)}, "extras[0] (opaque).tag", `""`},
		{"opaque data too long", 16, []Extra{Opaque("t", make([]byte, MaxExtraLen+1))}, "extras[0] (opaque).data", "1048577 bytes"},
		{"opaque tag twice", 16, []Extra{Opaque("t", []byte("1")), Opaque("t", []byte("2"))}, "extras (opaque).tag", `"t"`},
		{"multimodal zero hash", 16, []Extra{MultiModal([32]byte{}, 0, 1)}, "extras[0] (multimodal).contentHash", strings.Repeat("0", 64)},
		{"multimodal negative offset", 16, []Extra{MultiModal(h1, -1, 4)}, "extras[0] (multimodal).offset", "-1"},
		{"multimodal empty", 16, []Extra{MultiModal(h1, 3, 0)}, "extras[0] (multimodal).length", "0"},
		{"multimodal overlap", 16, []Extra{MultiModal(h1, 10, 5), MultiModal(h2, 3, 8)}, "extras (multimodal).offset", "10"},
		{"multimodal same range", 16, []Extra{MultiModal(h1, 3, 5), MultiModal(h1, 3, 5)}, "extras (multimodal).offset", "3"},
		{"multimodal offset too big", 16, []Extra{MultiModal(h1, maxOffset+1, 1)}, "extras[0] (multimodal).offset", "1073741825"},
		{"multimodal length too big", 16, []Extra{MultiModal(h1, 0, maxOffset+1)}, "extras[0] (multimodal).length", "1073741825"},
		// offset+length = 2^31 does not fit a 32-bit int: the overlap must
		// still be seen there.
		{"multimodal same range ending at 2^31", 16, []Extra{MultiModal(h1, maxOffset, maxOffset), MultiModal(h2, maxOffset, maxOffset)},
			"extras (multimodal).offset", "1073741824"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewChain(tt.blockSize, tt.extras...)
			if c != nil || err == nil {
				t.Fatalf("NewChain(%d, %v) = %v, %v; want an error", tt.blockSize, tt.extras, c, err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("NewChain error %v (%T) is not a *FieldError", err, err)
			}
			if fe.Field != tt.field || tt.value != "" && fe.Value != tt.value {
				t.Errorf("NewChain error field, value = %s, %s; want %s, %s (%v)", fe.Field, fe.Value, tt.field, tt.value, err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("error %q does not name the field %s", err, tt.field)
			}
			_, err2 := HashBlocks(tt.blockSize, seq(64), tt.extras...)
			if err2 == nil || err2.Error() != err.Error() {
				t.Errorf("HashBlocks error = %v, want %v", err2, err)
			}
		})
	}
}

func TestNewChainReportsEveryBadExtra(t *testing.T) {
	_, err := NewChain(16, CacheSalt(""), Opaque("", nil))
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v is not a *FieldError", err)
	}
	for _, want := range []string{"extras[0] (cache salt).salt", "extras[1] (opaque).tag"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestChainAppend(t *testing.T) {
	for _, n := range []int{1, 16, 128, 129, 256} {
		tokens := seq(3*n + n/2)
		want, err := HashBlocks(n, tokens)
		if err != nil {
			t.Fatal(err)
		}
		if len(want) != 3 {
			t.Fatalf("HashBlocks(%d, %d tokens) gave %d hashes, want 3", n, len(tokens), len(want))
		}
		c, _ := NewChain(n)
		// Append in pieces: a partial block, then a piece that completes it
		// and one more block, then the rest.
		var all []BlockHash
		for _, piece := range [][]Token{tokens[:n/2], tokens[n/2 : 2*n+n/2], tokens[2*n+n/2:]} {
			before := len(c.Hashes())
			got := c.Append(nil, piece...)
			if !slices.Equal(got, c.Hashes()[before:]) {
				t.Errorf("bs=%d: Append returned %v, want exactly the new hashes %v", n, got, c.Hashes()[before:])
			}
			all = append(all, got...)
		}
		if !slices.Equal(all, want) {
			t.Errorf("bs=%d: appended hashes %v, want %v", n, all, want)
		}
		if c.Len() != len(tokens) || c.BlockSize() != n {
			t.Errorf("bs=%d: Len, BlockSize = %d, %d; want %d, %d", n, c.Len(), c.BlockSize(), len(tokens), n)
		}
		// Append with nothing new keeps dst as it is.
		dst := []BlockHash{{1}}
		if got := c.Append(dst); len(got) != 1 || got[0] != dst[0] {
			t.Errorf("bs=%d: Append() = %v, want %v", n, got, dst)
		}
		c.Reset()
		if c.Len() != 0 || len(c.Hashes()) != 0 {
			t.Errorf("bs=%d: after Reset Len, Hashes = %d, %v", n, c.Len(), c.Hashes())
		}
		if got := c.Append(nil, tokens...); !slices.Equal(got, want) {
			t.Errorf("bs=%d: after Reset, Append = %v, want %v", n, got, want)
		}
	}
}

func TestChainDistinguishes(t *testing.T) {
	// Each pair must differ in the first block hash.
	base := seq(16)
	other := slices.Clone(base)
	other[15] = 1 << 24
	var h1, h2 [32]byte
	h1[0], h2[0] = 1, 2
	first := func(n int, tokens []Token, extras ...Extra) BlockHash {
		t.Helper()
		h, err := HashBlocks(n, tokens, extras...)
		if err != nil || len(h) == 0 {
			t.Fatalf("HashBlocks: %v, %v", h, err)
		}
		return h[0]
	}
	tests := []struct {
		name string
		a, b BlockHash
	}{
		{"tokens", first(16, base), first(16, other)},
		{"salt vs none", first(16, base, CacheSalt("s")), first(16, base)},
		{"salts", first(16, base, CacheSalt("s")), first(16, base, CacheSalt("t"))},
		{"adapter names", first(16, base, Adapter("a", h1)), first(16, base, Adapter("b", h1))},
		{"adapter fingerprints", first(16, base, Adapter("a", h1)), first(16, base, Adapter("a", h2))},
		{"salt vs adapter", first(16, base, CacheSalt("a")), first(16, base, Adapter("a", h1))},
		{"opaque split", first(16, base, Opaque("ab", []byte("c"))), first(16, base, Opaque("a", []byte("bc")))},
		{"salt vs opaque", first(16, base, CacheSalt("ab")), first(16, base, Opaque("a", []byte("b")))},
		{"two opaques vs one", first(16, base, Opaque("a", nil), Opaque("b", nil)), first(16, base, Opaque("a", []byte{0, 0, 0, 1, 0x23, 0, 0, 0, 'b', 0, 0, 0, 0}))},
		{"multimodal hash", first(16, base, MultiModal(h1, 2, 3)), first(16, base, MultiModal(h2, 2, 3))},
		{"multimodal offset", first(16, base, MultiModal(h1, 2, 3)), first(16, base, MultiModal(h1, 3, 3))},
		{"multimodal length", first(16, base, MultiModal(h1, 2, 3)), first(16, base, MultiModal(h1, 2, 4))},
		{"multimodal vs none", first(16, base, MultiModal(h1, 2, 3)), first(16, base)},
		{"block size", first(8, base), first(16, base)},
		{"split block size", first(129, seq(129)), first(130, seq(130))},
	}
	for _, tt := range tests {
		if tt.a == tt.b {
			t.Errorf("%s: both give %v", tt.name, tt.a)
		}
	}
}

func TestMultiModalBlocks(t *testing.T) {
	// An item over tokens [20, 40) with block size 16 overlaps blocks 1 and
	// 2 only: block 0 and block 3 hash as without it; block 1 differs, and
	// so does everything after it through the chain.
	var h [32]byte
	h[0] = 7
	tokens := seq(64)
	plain, _ := HashBlocks(16, tokens)
	with, _ := HashBlocks(16, tokens, MultiModal(h, 20, 20))
	if plain[0] != with[0] {
		t.Errorf("block 0 changed by an item that starts in block 1")
	}
	for i := 1; i < 4; i++ {
		if plain[i] == with[i] {
			t.Errorf("block %d unchanged by an item over blocks 1 and 2", i)
		}
	}
	// The item is bound into block 3 only through the chain: with the
	// parent fixed, block 3's message carries no extras digest.
	_, steps := refChain(16, tokens, []refExtra{{kind: "multimodal", hash: h, off: 20, n: 20}})
	for i, want := range []bool{false, true, true, false} {
		if got := steps[i].extrasMsg != nil; got != want {
			t.Errorf("block %d has extras = %v, want %v", i, got, want)
		}
	}
}

// TestMultiModalEndAt2To31 checks that an item ending at token 2^31, past
// what a 32-bit int holds, is bound into the blocks it overlaps and only
// those, on every platform (GOARCH=386 go test runs this with 32-bit ints).
// Hashing 2^30 tokens to reach it would take too long, so the test asks the
// chain for the extras of blocks at those positions directly.
func TestMultiModalEndAt2To31(t *testing.T) {
	var h [32]byte
	h[0] = 1
	item := refExtra{kind: "multimodal", hash: h, off: maxOffset, n: maxOffset}
	for _, tt := range []struct {
		start int64 // first token of the block
		want  bool  // whether the item overlaps it
	}{
		{0, false},
		{maxOffset - 16, false},
		{maxOffset, true},
		{1<<31 - 16, true},
		{1 << 31, false},
		{1<<32 + 16, false},
	} {
		c, err := NewChain(16, item.extra())
		if err != nil {
			t.Fatal(err)
		}
		got := c.blockExtrasAt(tt.start)
		if got != tt.want {
			t.Errorf("block at token %d: has extras = %v, want %v", tt.start, got, tt.want)
			continue
		}
		want := refBlockExtrasMessage([]refExtra{item}, tt.start, 16)
		if got && !bytes.Equal(c.xbuf, want) {
			t.Errorf("block at token %d: extras message %x, want %x", tt.start, c.xbuf, want)
		}
	}
	// Appending a block before the item must not drop it.
	c, err := NewChain(16, item.extra())
	if err != nil {
		t.Fatal(err)
	}
	c.Append(nil, seq(16)...)
	if !c.blockExtrasAt(maxOffset) {
		t.Errorf("after block 0, the item at %d (length %d) is no longer bound into the block at %d", item.off, item.n, maxOffset)
	}
}

func TestAppendAllocs(t *testing.T) {
	var h [32]byte
	h[0] = 1
	cases := []struct {
		name   string
		n      int
		extras []Extra
	}{
		{"bs=1", 1, nil},
		{"bs=16", 16, nil},
		{"bs=64 with extras", 64, []Extra{CacheSalt("s"), Adapter("lora", h), Opaque("x", []byte("y"))}},
		{"bs=128", 128, nil},
		{"bs=256", 256, nil},
		{"bs=16 multimodal", 16, []Extra{MultiModal(h, 5, 100), MultiModal(h, 300, 3)}},
		{"bs=4096", 4096, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tokens := seq(8*tc.n + tc.n/2)
			c, err := NewChain(tc.n, tc.extras...)
			if err != nil {
				t.Fatal(err)
			}
			dst := c.Append(nil, tokens...) // warm up: grow every buffer once
			bulk := testing.AllocsPerRun(20, func() {
				c.Reset()
				dst = c.Append(dst[:0], tokens...)
			})
			// Token by token, the way a decode loop appends.
			single := testing.AllocsPerRun(5, func() {
				c.Reset()
				dst = dst[:0]
				for _, tok := range tokens {
					dst = c.Append(dst, tok)
				}
			})
			if bulk != 0 || single != 0 {
				t.Errorf("allocations per run of 8 blocks: %v in bulk, %v token by token; want 0", bulk, single)
			}
			if len(dst) != 8 {
				t.Fatalf("got %d hashes, want 8", len(dst))
			}
		})
	}
}

func TestChainString(t *testing.T) {
	c, _ := NewChain(4)
	c.Append(nil, seq(9)...)
	if got, want := c.String(), "hashing.Chain{blockSize: 4, tokens: 9, blocks: 2}"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
