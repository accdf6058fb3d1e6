package connector

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvconnect/kvconnect/hashing"
)

// frameOf wraps body in a frame of the given magic with a valid length and
// checksum.
func frameOf(magic string, body []byte) []byte {
	b := append(appendHeader(nil, magic), body...)
	b, err := closeFrame(b, 0, "test")
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzWireBody decodes arbitrary bodies behind a valid header and checksum,
// which random frames almost never reach: decoding never panics, refusals
// wrap ErrBadMetadata, and what decodes round-trips.
func FuzzWireBody(f *testing.F) {
	seeds := benchMetadata()
	// and one whose load carries a connector's parameters
	seeds = append(seeds, struct {
		name string
		m    Metadata
	}{"params", Metadata{Step: 9, Generation: 2, Loads: []Transfer{{ID: 14, Req: "p", Blocks: []BlockID{3}, Hashes: make([]hashing.BlockHash, 1), Params: []byte(`{"v":2,"offer":77}`)}}}})
	for _, m := range seeds {
		body, err := m.m.appendBody(nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(false, body)
	}
	o := Output{Rank: 3, Done: []uint64{1, 2}, Failed: []Failure{{Transfer: 2, Index: 5, Reason: ReasonNotFound}}}
	body, err := o.appendBody(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(true, body)
	f.Fuzz(func(t *testing.T, output bool, body []byte) {
		if output {
			var o Output
			if err := o.UnmarshalBinary(frameOf(outMagic, body)); err != nil {
				if !errors.Is(err, ErrBadMetadata) {
					t.Fatalf("Output.UnmarshalBinary error %v does not wrap ErrBadMetadata", err)
				}
				return
			}
			b, err := o.MarshalBinary()
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			var o2 Output
			if err := o2.UnmarshalBinary(b); err != nil {
				t.Fatalf("decode of re-encoding: %v", err)
			}
			if diff := cmp.Diff(o, o2, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("output round trip (-first +second):\n%s", diff)
			}
			return
		}
		var m Metadata
		if err := m.UnmarshalBinary(frameOf(metaMagic, body)); err != nil {
			if !errors.Is(err, ErrBadMetadata) {
				t.Fatalf("Metadata.UnmarshalBinary error %v does not wrap ErrBadMetadata", err)
			}
			return
		}
		b, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		var m2 Metadata
		if err := m2.UnmarshalBinary(b); err != nil {
			t.Fatalf("decode of re-encoding: %v", err)
		}
		if diff := cmp.Diff(m, m2, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("metadata round trip (-first +second):\n%s", diff)
		}
		if b2, _ := m2.MarshalBinary(); !bytes.Equal(b, b2) {
			t.Fatalf("metadata encoding not stable")
		}
	})
}

// TestFramingAllocs checks that the framing allocates nothing: a frame
// decodes with the allocations of its body alone. (TestAppendBinaryAllocs
// checks that encoding into a buffer with room makes none.)
func TestFramingAllocs(t *testing.T) {
	for _, s := range benchMetadata() {
		frame, err := s.m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		body := frame[frameHeader : len(frame)-frameTrailer]
		var m Metadata
		framed := testing.AllocsPerRun(20, func() {
			if err := m.UnmarshalBinary(frame); err != nil {
				t.Fatal(err)
			}
		})
		plain := testing.AllocsPerRun(20, func() {
			if err := m.decodeBody(body); err != nil {
				t.Fatal(err)
			}
		})
		if framed != plain {
			t.Errorf("%s: UnmarshalBinary makes %v allocations, decoding the body alone %v", s.name, framed, plain)
		}
	}
}

// benchMetadata returns steps of three sizes, the ones the wire
// benchmarks encode: an idle step, one request loading and saving 4
// blocks, and 64 requests each loading and saving 16 blocks.
func benchMetadata() []struct {
	name string
	m    Metadata
} {
	step := func(reqs, blocks int) Metadata {
		m := Metadata{Step: 1 << 20, Generation: 3}
		for r := range reqs {
			for i, list := range []*[]Transfer{&m.Loads, &m.Saves} {
				t := Transfer{ID: uint64(2*r + i + 1<<16), Req: RequestID(fmt.Sprintf("req-%08d", r)), First: 32 * i}
				for j := range blocks {
					t.Blocks = append(t.Blocks, BlockID(1000+r*blocks*2+i*blocks+j))
					var h hashing.BlockHash
					for k := range h {
						h[k] = byte(r*131 + j*17 + k*7 + i)
					}
					t.Hashes = append(t.Hashes, h)
				}
				*list = append(*list, t)
			}
		}
		return m
	}
	return []struct {
		name string
		m    Metadata
	}{
		{"idle", Metadata{Step: 1 << 20, Generation: 3}},
		{"1x4", step(1, 4)},
		{"64x16", step(64, 16)},
	}
}

func median(x []float64) float64 {
	x = slices.Clone(x)
	slices.Sort(x)
	return x[len(x)/2]
}

// BenchmarkMetadataWire encodes and decodes Metadata as a whole frame
// (AppendBinary and UnmarshalBinary: header, body, length and checksum)
// and, interleaved with it, its body alone (appendBody and decodeBody, the
// same code without the framing), both into reused buffers. Each
// iteration times reps encodes and reps decodes of each, the order
// alternating between iterations; the metrics are medians over the
// iterations, so that bursts of load from other processes skew neither
// side.
//
// framed/plain is the ratio of encode+decode time, enc-framed/plain of the
// encodes alone; framed-ns and plain-ns are the encode+decode time of one
// frame and of one body, B/frame the frame's size.
func BenchmarkMetadataWire(b *testing.B) {
	for _, s := range benchMetadata() {
		b.Run(s.name, func(b *testing.B) {
			m := &s.m
			frame, err := m.MarshalBinary()
			if err != nil {
				b.Fatal(err)
			}
			body, err := m.appendBody(nil)
			if err != nil {
				b.Fatal(err)
			}
			reps := max(1, 64<<10/len(frame))
			buf := make([]byte, 0, len(frame))
			var dec Metadata
			plainEnc := func() {
				for range reps {
					buf, _ = m.appendBody(buf[:0])
				}
			}
			framedEnc := func() {
				for range reps {
					buf, _ = m.AppendBinary(buf[:0])
				}
			}
			plainDec := func() {
				for range reps {
					if err := dec.decodeBody(body); err != nil {
						b.Fatal(err)
					}
				}
			}
			framedDec := func() {
				for range reps {
					if err := dec.UnmarshalBinary(frame); err != nil {
						b.Fatal(err)
					}
				}
			}
			timed := func(f func()) float64 {
				t0 := time.Now()
				f()
				return float64(time.Since(t0).Nanoseconds()) / float64(reps)
			}
			var framed, plain, ratio, encRatio []float64
			odd := false
			for b.Loop() {
				odd = !odd
				var pe, fe, pd, fd float64
				if odd {
					pe, fe, pd, fd = timed(plainEnc), timed(framedEnc), timed(plainDec), timed(framedDec)
				} else {
					fe, pe, fd, pd = timed(framedEnc), timed(plainEnc), timed(framedDec), timed(plainDec)
				}
				framed = append(framed, fe+fd)
				plain = append(plain, pe+pd)
				ratio = append(ratio, (fe+fd)/(pe+pd))
				encRatio = append(encRatio, fe/pe)
			}
			b.ReportMetric(median(framed), "framed-ns")
			b.ReportMetric(median(plain), "plain-ns")
			b.ReportMetric(median(ratio), "framed/plain")
			b.ReportMetric(median(encRatio), "enc-framed/plain")
			b.ReportMetric(float64(len(frame)), "B/frame")
		})
	}
}

// BenchmarkFrameChecksum computes the frame checksum, CRC-32 (IEEE), and
// CRC-32C (Castagnoli) over the frames of BenchmarkMetadataWire,
// interleaved in the same way; ieee/castagnoli is the median ratio of
// their times.
func BenchmarkFrameChecksum(b *testing.B) {
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	for _, s := range benchMetadata() {
		b.Run(s.name, func(b *testing.B) {
			frame, err := s.m.MarshalBinary()
			if err != nil {
				b.Fatal(err)
			}
			p := frame[:len(frame)-frameTrailer]
			reps := max(1, 64<<10/len(frame))
			var sum uint32
			timed := func(f func()) float64 {
				t0 := time.Now()
				for range reps {
					f()
				}
				return float64(time.Since(t0).Nanoseconds()) / float64(reps)
			}
			cast := func() { sum += crc32.Checksum(p, castagnoli) }
			ie := func() { sum += checksum(p) }
			var c, i, ratio []float64
			odd := false
			for b.Loop() {
				odd = !odd
				var tc, ti float64
				if odd {
					tc, ti = timed(cast), timed(ie)
				} else {
					ti, tc = timed(ie), timed(cast)
				}
				c = append(c, tc)
				i = append(i, ti)
				ratio = append(ratio, ti/tc)
			}
			b.ReportMetric(median(c), "castagnoli-ns")
			b.ReportMetric(median(i), "ieee-ns")
			b.ReportMetric(median(ratio), "ieee/castagnoli")
			b.ReportMetric(float64(len(p)), "B")
			if sum == 1 {
				b.Log(sum) // keeps the sums live
			}
		})
	}
}
