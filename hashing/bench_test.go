package hashing

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/zeebo/blake3"
)

// benchTokens are the tokens of the chain benchmarks: 1M pseudo-random ids
// below 2^17, like a large vocabulary's.
func benchTokens(n int) []Token {
	t := make([]Token, n)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range t {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		t[i] = Token(x % (1 << 17))
	}
	return t
}

// plainChain is the baseline: h_i = hash(h_{i-1} || tokens_i as
// little-endian uint32), with no tags, extras or seed. It continues from
// parent and returns the last hash.
func plainChain(dst []BlockHash, parent [32]byte, buf []byte, n int, tokens []Token, sum func([]byte) [32]byte) ([]BlockHash, [32]byte) {
	for len(tokens) >= n {
		copy(buf, parent[:])
		putTokens(buf[32:], tokens[:n])
		parent = sum(buf[:32+4*n])
		dst = append(dst, parent)
		tokens = tokens[n:]
	}
	return dst, parent
}

// tokensOnly hashes each block's token bytes alone, unchained: a floor for
// any chain that reads every token byte with BLAKE3.
func tokensOnly(dst []BlockHash, buf []byte, n int, tokens []Token) []BlockHash {
	for len(tokens) >= n {
		putTokens(buf, tokens[:n])
		dst = append(dst, blake3.Sum256(buf[:4*n]))
		tokens = tokens[n:]
	}
	return dst
}

func blake3Sum(b []byte) [32]byte { return blake3.Sum256(b) }
func sha256Sum(b []byte) [32]byte { return sha256.Sum256(b) }

func median(x []float64) float64 {
	x = slices.Clone(x)
	slices.Sort(x)
	if len(x) == 0 {
		return 0
	}
	return x[len(x)/2]
}

// BenchmarkChain hashes 1M tokens per iteration with a Chain (no extras)
// and, interleaved with it, with a plain BLAKE3 chain and a SHA-256 chain
// over the same bytes, and BLAKE3 of each block's token bytes alone
// (tokens-only, unchained: a floor for any BLAKE3 chain). The tokens go in
// segments of 64K; each segment is timed for every implementation in turn,
// the order alternating, and the metrics are medians over the segments, so
// that bursts of load from other processes skew neither side.
//
// ns/op is the time of all four; the metrics are ns/block of each
// implementation, full/plain and full/sha256 (medians of the per-segment
// ratios), Mtok/s of the chain and its allocations per block.
func BenchmarkChain(b *testing.B) {
	const total, seg = 1 << 20, 1 << 16
	tokens := benchTokens(total)
	for _, n := range []int{16, 64, 256} {
		b.Run(fmt.Sprintf("bs=%d", n), func(b *testing.B) {
			c, err := NewChain(n)
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]BlockHash, 0, total/n)
			allocs := testing.AllocsPerRun(3, func() {
				c.Reset()
				dst = c.Append(dst[:0], tokens...)
			})
			buf := make([]byte, 32+4*n)
			var full, plain, sha, floor, rPlain, rSha []float64
			odd := false
			for b.Loop() {
				c.Reset()
				var pb, ps [32]byte
				for i := 0; i < total; i += seg {
					in := tokens[i : i+seg]
					var dFull, dPlain time.Duration
					odd = !odd
					if odd {
						t0 := time.Now()
						dst, pb = plainChain(dst[:0], pb, buf, n, in, blake3Sum)
						dPlain = time.Since(t0)
					}
					t0 := time.Now()
					dst = c.Append(dst[:0], in...)
					dFull = time.Since(t0)
					if !odd {
						t0 := time.Now()
						dst, pb = plainChain(dst[:0], pb, buf, n, in, blake3Sum)
						dPlain = time.Since(t0)
					}
					t0 = time.Now()
					dst, ps = plainChain(dst[:0], ps, buf, n, in, sha256Sum)
					dSha := time.Since(t0)
					t0 = time.Now()
					dst = tokensOnly(dst[:0], buf, n, in)
					dFloor := time.Since(t0)
					blocks := float64(seg / n)
					full = append(full, float64(dFull)/blocks)
					plain = append(plain, float64(dPlain)/blocks)
					sha = append(sha, float64(dSha)/blocks)
					floor = append(floor, float64(dFloor)/blocks)
					rPlain = append(rPlain, float64(dFull)/float64(dPlain))
					rSha = append(rSha, float64(dFull)/float64(dSha))
				}
			}
			b.ReportMetric(median(full), "ns/block")
			b.ReportMetric(median(plain), "plain-ns/block")
			b.ReportMetric(median(sha), "sha256-ns/block")
			b.ReportMetric(median(floor), "tokens-only-ns/block")
			b.ReportMetric(median(rPlain), "full/plain")
			b.ReportMetric(median(rSha), "full/sha256")
			b.ReportMetric(float64(n)*1e3/median(full), "Mtok/s")
			b.ReportMetric(allocs/float64(total/n), "allocs/block")
		})
	}
}

// BenchmarkChainDecode appends 1M tokens one at a time, as a decode loop
// does, with block size 16.
func BenchmarkChainDecode(b *testing.B) {
	const total = 1 << 20
	tokens := benchTokens(total)
	c, _ := NewChain(16)
	dst := make([]BlockHash, 0, 16)
	c.Append(nil, tokens...)
	b.ReportAllocs()
	for b.Loop() {
		c.Reset()
		for _, t := range tokens {
			dst = c.Append(dst[:0], t)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/total, "ns/token")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(total/16), "ns/block")
}

// BenchmarkChainExtras hashes 64K tokens with block size 16 and every kind
// of extra, with an image every 1024 tokens.
func BenchmarkChainExtras(b *testing.B) {
	const total = 1 << 16
	tokens := benchTokens(total)
	var h [32]byte
	h[0] = 1
	extras := []Extra{CacheSalt("user-42"), Adapter("lora", h), Opaque("tag", []byte("data"))}
	for off := 0; off < total; off += 1024 {
		extras = append(extras, MultiModal(h, off+100, 576))
	}
	c, err := NewChain(16, extras...)
	if err != nil {
		b.Fatal(err)
	}
	dst := c.Append(nil, tokens...)
	b.ReportAllocs()
	for b.Loop() {
		c.Reset()
		dst = c.Append(dst[:0], tokens...)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(total/16), "ns/block")
}

// BenchmarkAppendKey formats one block's key into a reused buffer. Beside
// it, in alternating batches of 1024, it times one block hash of the plain
// BLAKE3 chain at block size 16 (BLAKE3 of 96 bytes), so that key/block-hash
// is a ratio measured under the same load; ns/key and block-hash-ns are
// medians over the batches.
func BenchmarkAppendKey(b *testing.B) {
	ns := testNamespace(b, nil)
	h := BlockHash{1, 2, 3}
	buf := make([]byte, 0, MaxKeyLen)
	b.Run("AppendKey", func(b *testing.B) {
		const batch = 1024
		var in [96]byte
		var sink [32]byte
		var keyNs, hashNs, ratio []float64
		for b.Loop() {
			t0 := time.Now()
			for range batch {
				buf = ns.AppendKey(buf[:0], 1, h)
			}
			t1 := time.Now()
			for range batch {
				sink = blake3.Sum256(in[:])
				in[0] = sink[0]
			}
			t2 := time.Now()
			dk, dh := t1.Sub(t0), t2.Sub(t1)
			keyNs = append(keyNs, float64(dk)/batch)
			hashNs = append(hashNs, float64(dh)/batch)
			ratio = append(ratio, float64(dk)/float64(dh))
		}
		b.ReportMetric(median(keyNs), "ns/key")
		b.ReportMetric(median(hashNs), "block-hash-ns")
		b.ReportMetric(median(ratio), "key/block-hash")
		allocs := testing.AllocsPerRun(100, func() { buf = ns.AppendKey(buf[:0], 1, h) })
		b.ReportMetric(allocs, "allocs/key")
	})
	b.Run("Key", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = ns.Key(1, h)
		}
	})
	b.Run("ParseKey", func(b *testing.B) {
		key := ns.Key(1, h)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ParseKey(key); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkNamespace validates, encodes and hashes an identity.
func BenchmarkNamespace(b *testing.B) {
	id := validIdentity()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := id.Namespace(); err != nil {
			b.Fatal(err)
		}
	}
}
