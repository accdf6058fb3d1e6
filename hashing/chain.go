package hashing

import (
	"encoding/binary"
	"fmt"

	"github.com/zeebo/blake3"
)

// Chain hashes the full blocks of one request's tokens, incrementally: each
// [Chain.Append] hashes only the blocks that its tokens complete, and
// nothing is hashed twice. The hash of block i covers the hash of block i-1
// (or, for block 0, the chain's seed, which binds the request-wide extras),
// the block's tokens and the multimodal items that overlap the block. A
// partial last block is kept until more tokens complete it.
//
// The encoding is specified byte by byte in hashing/SPEC.md; equal inputs
// give equal hashes on every machine and in every process.
//
// A Chain is not safe for concurrent use. Reuse one with [Chain.Reset] to
// hash without allocating.
type Chain struct {
	n      int // block size in tokens
	split  bool
	seed   BlockHash
	mm     []mmItem // sorted by offset, non-overlapping
	mmNext int      // first item that may overlap the next block

	hashes []BlockHash
	total  int // tokens appended
	npend  int // tokens of the partial block

	// msg holds the block message in the layout
	//   [0:8] header with extras | [8:40] extras digest |
	//   [32:40] header without extras (overlaps the digest's tail) |
	//   [40:72] parent | [72:] tokens (direct form) or token digest (split form)
	// so that both forms hash a contiguous slice without moving the tokens.
	msg     []byte
	pend    []byte         // split form: bytes of the partial block
	th      *blake3.Hasher // split form: derive-key hasher, made on first use
	xbuf    []byte         // block extras message scratch
	hdr     [blockHeaderLen]byte
	hdrX    [blockHeaderLen]byte
	payload int // bytes after the parent: 4n (direct) or 32 (split)
}

const (
	offHdrX    = 0
	offExtras  = 8
	offHdr     = 32
	offParent  = 40
	offPayload = 72
)

// NewChain returns an empty chain over blocks of blockSize tokens (1 to
// [MaxBlockSize]) with the given extra keys. For keys of a [Namespace],
// blockSize must be the namespace's [Namespace.BlockSize]. It returns a [*FieldError] (or
// several, joined) naming the block size or the extra and the value when
// they are invalid: an empty salt, adapter name or opaque tag, an all-zero
// fingerprint or content hash, a second salt or adapter, a repeated opaque
// tag, a negative offset, an empty or overlapping multimodal item, a field
// longer than [MaxExtraLen].
func NewChain(blockSize int, extras ...Extra) (*Chain, error) {
	if blockSize < 1 || blockSize > MaxBlockSize {
		return nil, fieldErr("blockSize", blockSize, "must be 1 to %d tokens", MaxBlockSize)
	}
	seed, mm, err := compileExtras(extras)
	if err != nil {
		return nil, err
	}
	c := &Chain{n: blockSize, seed: seed, mm: mm, split: blockSize > directMax}
	kind := byte(kindBlock)
	if c.split {
		kind = kindBlockSplit
		c.payload = 32
		c.pend = make([]byte, 4*blockSize)
	} else {
		c.payload = 4 * blockSize
	}
	c.hdr = blockHeader(kind, 0, blockSize)
	c.hdrX = blockHeader(kind, flagExtras, blockSize)
	c.msg = make([]byte, offPayload+c.payload)
	*(*[blockHeaderLen]byte)(c.msg[offHdr:]) = c.hdr
	c.Reset()
	return c, nil
}

// HashBlocks returns the hashes of the full blocks of tokens, as a new
// [Chain] would give them; a partial last block is not hashed. It returns
// the errors of [NewChain].
func HashBlocks(blockSize int, tokens []Token, extras ...Extra) ([]BlockHash, error) {
	c, err := NewChain(blockSize, extras...)
	if err != nil {
		return nil, err
	}
	c.hashes = make([]BlockHash, 0, len(tokens)/blockSize)
	c.add(tokens)
	return c.hashes, nil
}

// Reset empties c, as if it were new with the same block size and extras,
// and keeps its buffers so that appending again does not allocate.
// Slices returned by [Chain.Hashes] before are overwritten by later appends.
func (c *Chain) Reset() {
	c.hashes = c.hashes[:0]
	c.total, c.npend, c.mmNext = 0, 0, 0
	*(*BlockHash)(c.msg[offParent:]) = c.seed
}

// BlockSize returns the chain's block size in tokens.
func (c *Chain) BlockSize() int { return c.n }

// Len returns the number of tokens appended since the chain was made or
// last reset, including those of the partial last block.
func (c *Chain) Len() int { return c.total }

// Hashes returns the hashes of all full blocks so far, block 0 first. The
// slice is owned by the chain: read it only, and only until the next call
// of Append or Reset.
func (c *Chain) Hashes() []BlockHash { return c.hashes }

// Append adds tokens to the request, appends the hashes of the blocks they
// complete (and only those) to dst, and returns the extended slice. With
// enough capacity in dst and in the chain (after a [Chain.Reset] of a chain
// that held as many blocks), Append does not allocate. dst must not alias
// the slice returned by [Chain.Hashes].
func (c *Chain) Append(dst []BlockHash, tokens ...Token) []BlockHash {
	before := len(c.hashes)
	c.add(tokens)
	return append(dst, c.hashes[before:]...)
}

// add appends tokens, hashing the blocks they complete into c.hashes.
func (c *Chain) add(tokens []Token) {
	if len(tokens) == 1 && !c.split {
		// One decoded token: the common case in a decode loop.
		binary.LittleEndian.PutUint32(c.msg[offPayload+4*c.npend:], tokens[0])
		c.total++
		if c.npend++; c.npend == c.n {
			c.npend = 0
			c.finishBlock()
		}
		return
	}
	c.total += len(tokens)
	for len(tokens) > 0 {
		if c.npend == 0 && len(tokens) >= c.n {
			// A whole block straight from the input.
			block := tokens[:c.n]
			tokens = tokens[c.n:]
			if c.split {
				c.digestTokens(block)
			} else {
				putTokens(c.msg[offPayload:], block)
			}
			c.finishBlock()
			continue
		}
		k := min(c.n-c.npend, len(tokens))
		if c.split {
			putTokens(c.pend[4*c.npend:], tokens[:k])
		} else {
			putTokens(c.msg[offPayload+4*c.npend:], tokens[:k])
		}
		c.npend += k
		tokens = tokens[k:]
		if c.npend == c.n {
			c.npend = 0
			if c.split {
				c.digestBytes(c.pend)
			}
			c.finishBlock()
		}
	}
}

// digestTokens writes the token digest of block into the payload slot.
func (c *Chain) digestTokens(block []Token) {
	if littleEndian {
		c.digestBytes(tokenBytes(block))
		return
	}
	putTokens(c.pend, block)
	c.digestBytes(c.pend)
}

// digestBytes writes the derive-key digest of b into the payload slot.
func (c *Chain) digestBytes(b []byte) {
	if c.th == nil {
		c.th = blake3.NewDeriveKey(tokenContext)
	}
	c.th.Reset()
	_, _ = c.th.Write(b) // never fails
	c.th.Sum(c.msg[offPayload:offPayload:len(c.msg)])
}

// finishBlock hashes the block message whose payload is in place, records
// the hash and makes it the next block's parent.
func (c *Chain) finishBlock() {
	start := offHdr
	if c.mmNext < len(c.mm) && c.blockExtras() {
		start = offHdrX
	}
	h := BlockHash(blake3.Sum256(c.msg[start : offPayload+c.payload]))
	if start == offHdrX {
		// The extras digest overwrote the header without extras.
		*(*[blockHeaderLen]byte)(c.msg[offHdr:]) = c.hdr
	}
	*(*BlockHash)(c.msg[offParent:]) = h
	c.hashes = append(c.hashes, h)
}

// blockExtras computes the block extras digest of the block being finished
// into its slot, with the header that announces it, and reports whether the
// block has one (whether any multimodal item overlaps it). Call it only
// while c.mmNext < len(c.mm).
func (c *Chain) blockExtras() bool {
	return c.blockExtrasAt(int64(len(c.hashes)) * int64(c.n))
}

// blockExtrasAt is blockExtras for the block whose first token is at
// start. Positions are int64: an item may end at 2^31, and a chain may pass
// 2^31 tokens, even where int has 32 bits.
func (c *Chain) blockExtrasAt(start int64) bool {
	end := start + int64(c.n)
	for c.mmNext < len(c.mm) && c.mm[c.mmNext].off+c.mm[c.mmNext].n <= start {
		c.mmNext++
	}
	j := c.mmNext
	for j < len(c.mm) && c.mm[j].off < end {
		j++
	}
	items := c.mm[c.mmNext:j]
	if len(items) == 0 {
		return false
	}
	b := append(c.xbuf[:0], SpecVersion, kindBlockExtras)
	b = appendU32(b, uint32(len(items)))
	for _, it := range items {
		b = append(b, extraMultiModal)
		b = append(b, it.hash[:]...)
		b = binary.LittleEndian.AppendUint64(b, uint64(it.off-start))
		b = binary.LittleEndian.AppendUint64(b, uint64(it.n))
	}
	c.xbuf = b
	*(*[blockHeaderLen]byte)(c.msg[offHdrX:]) = c.hdrX
	*(*BlockHash)(c.msg[offExtras:]) = blake3.Sum256(b)
	return true
}

// String describes the chain for logs.
func (c *Chain) String() string {
	return fmt.Sprintf("hashing.Chain{blockSize: %d, tokens: %d, blocks: %d}", c.n, c.total, len(c.hashes))
}
