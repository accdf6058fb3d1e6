package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// FuzzParseStep: a step frame from the scheduler decodes to items a rank
// can compute, or to an error; never a panic. What decodes encodes back
// to the same step.
func FuzzParseStep(f *testing.F) {
	meta := &connector.Metadata{Step: 3, Loads: []connector.Transfer{{ID: 1, Req: "r", Blocks: []connector.BlockID{4}, Hashes: make([]hashing.BlockHash, 1)}}}
	for _, seed := range []struct {
		meta *connector.Metadata
		its  []stepItem
	}{
		{nil, nil},
		{meta, []stepItem{{Blocks: []connector.BlockID{4, 2}, Tokens: []hashing.Token{9, 8, 7, 6}, Start: 2, End: 4}}},
		{nil, []stepItem{{Blocks: []connector.BlockID{4}, Tokens: make([]hashing.Token, fuzzBlock), Start: fuzzBlock - 1, End: fuzzBlock}}},
	} {
		b, err := tpStep(nil, seed.meta, seed.its)
		f.Add(frame162())
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var meta *connector.Metadata
		var its []stepItem
		var err error
		checkAlloc(t, "parseStep", len(b), func() { meta, its, err = parseStep(b, nil, fuzzBlock) })
		if err != nil {
			return
		}
		for i, it := range its {
			if it.Start > it.End || len(it.Tokens) != it.End {
				t.Fatalf("item %d: start %d, end %d, %d tokens", i, it.Start, it.End, len(it.Tokens))
			}
		}
		again, err := tpStep(nil, meta, its)
		if err != nil {
			t.Fatal(err)
		}
		meta2, its2, err := parseStep(again, nil, fuzzBlock)
		if err != nil {
			t.Fatalf("the step re-encoded does not decode: %v", err)
		}
		if diff := cmp.Diff(its, its2); diff != "" {
			t.Fatalf("items after a round trip (-first +second):\n%s", diff)
		}
		if (meta == nil) != (meta2 == nil) {
			t.Fatalf("metadata %v after a round trip of %v", meta2, meta)
		}
	})
}

// FuzzRankDone: a done frame from a rank yields its tokens and an Output
// the ledger accepts, or an error; never a panic.
func FuzzRankDone(f *testing.F) {
	o := &connector.Output{Rank: 1, Done: []uint64{5}, Failed: []connector.Failure{{Transfer: 5, Index: 0, Reason: connector.ReasonIO}}}
	ob, err := o.MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(append([]byte{2, 7, 9, byte(len(ob))}, ob...))
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		pr := &procRanks{ledger: connector.NewLedger(2), toks: make([][]hashing.Token, 2)}
		if err := pr.ledger.Shipped(&connector.Metadata{Loads: []connector.Transfer{{ID: 5, Blocks: make([]connector.BlockID, 1)}}}); err != nil {
			t.Fatal(err)
		}
		var err error
		checkAlloc(t, "done", len(b), func() { err = pr.done(1, b) })
		if err != nil {
			return
		}
		for _, o := range pr.outs {
			if o.Rank != 1 {
				t.Fatalf("an Output of rank %d from rank 1's frame", o.Rank)
			}
		}
	})
}

// fuzzBlock is the block size the fuzz targets decode steps with.
const fuzzBlock = 16

// allocPerByte and allocSlack bound what decoding n bytes of a frame may
// allocate: allocPerByte×n + allocSlack. A step item's tokens take up to
// 4×fuzzBlock bytes per byte of the frame (its blocks bound its end);
// the rest is the items, the Metadata and its slices, a few times the
// input each.
const (
	allocPerByte = 4*fuzzBlock + 512
	allocSlack   = 64 << 10
)

// checkAlloc runs f, the decoding of n bytes of input, and fails t if
// it allocated more than allocPerByte×n + allocSlack bytes: memory that
// grows faster than the input is a decoder a small frame can exhaust.
func checkAlloc(t testing.TB, what string, n int, f func()) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(allocPerByte*n+allocSlack); got > limit {
		t.Fatalf("%s of %d bytes allocated %d bytes, more than %d", what, n, got, limit)
	}
}

// frame162 is a step frame of 162 bytes: no Metadata, and 16 items that
// each claim 2^24 positions of which they carry no token, and no block.
// A decoder that allocates an item's positions before it knows they fit
// its blocks allocates 1 GiB for it.
func frame162() []byte {
	b := binary.AppendUvarint(nil, 0)
	b = binary.AppendUvarint(b, 16)
	for range 16 {
		b = binary.AppendUvarint(b, 1<<24) // start
		b = binary.AppendUvarint(b, 1<<24) // end
		b = binary.AppendUvarint(b, 0)     // tokens
		b = binary.AppendUvarint(b, 0)     // blocks
	}
	return b
}

// TestParseStepSmallFrame: the 162-byte frame fails to decode, naming the
// item whose positions do not fit its blocks, and allocates about its
// size, not 1 GiB.
func TestParseStepSmallFrame(t *testing.T) {
	b := frame162()
	if len(b) != 162 {
		t.Fatalf("frame162() is %d bytes, want 162", len(b))
	}
	var err error
	checkAlloc(t, "parseStep", len(b), func() { _, _, err = parseStep(b, nil, fuzzBlock) })
	if err == nil {
		t.Fatal("parseStep(frame162()) = nil error, want a malformed frame")
	}
	t.Log(err)
}

// TestFrameReadClaimsMore: a frame header that claims 1 GiB, followed by
// 100 bytes and the end of the input, fails as a frame cut short, and the
// read allocated about what arrived.
func TestFrameReadClaimsMore(t *testing.T) {
	in := []byte{opStep, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(in[1:], 1<<30)
	in = append(in, make([]byte, 100)...)
	f := &frames{r: bufio.NewReader(bytes.NewReader(in))}
	var err error
	checkAlloc(t, "frames.read", len(in), func() { _, _, err = f.read() })
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read() = %v, want io.ErrUnexpectedEOF", err)
	}
}

// TestFrameReadRoundTrip: frames of several sizes, across the buffer's
// growth, read back as written.
func TestFrameReadRoundTrip(t *testing.T) {
	var w bytes.Buffer
	sizes := []int{0, 1, frameChunk - 1, frameChunk, frameChunk + 1, 5*frameChunk + 3, 7}
	for i, n := range sizes {
		p := bytes.Repeat([]byte{byte(i + 1)}, n)
		hdr := []byte{byte(i + 1), 0, 0, 0, 0}
		binary.LittleEndian.PutUint32(hdr[1:], uint32(n))
		w.Write(hdr)
		w.Write(p)
	}
	f := &frames{r: bufio.NewReader(&w)}
	for i, n := range sizes {
		op, p, err := f.read()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if op != byte(i+1) || !bytes.Equal(p, bytes.Repeat([]byte{byte(i + 1)}, n)) {
			t.Fatalf("frame %d: op %d, %d bytes; want op %d, %d bytes of %d", i, op, len(p), i+1, n, i+1)
		}
	}
}
