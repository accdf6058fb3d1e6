package connector_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"pgregory.net/rapid"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

func genTransfer(t *rapid.T) connector.Transfer {
	n := rapid.IntRange(0, 5).Draw(t, "n")
	tr := connector.Transfer{
		ID:    rapid.Uint64().Draw(t, "id"),
		Req:   connector.RequestID(rapid.String().Draw(t, "req")),
		Group: int(rapid.Int32Range(0, math.MaxInt32).Draw(t, "group")),
		First: int(rapid.Int32().Draw(t, "first")),
	}
	for i := 0; i < n; i++ {
		tr.Blocks = append(tr.Blocks, connector.BlockID(rapid.Int32().Draw(t, "block")))
		var h hashing.BlockHash
		copy(h[:], rapid.SliceOfN(rapid.Byte(), 32, 32).Draw(t, "hash"))
		tr.Hashes = append(tr.Hashes, h)
	}
	return tr
}

func TestMetadataRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := connector.Metadata{
			Step:       rapid.Uint64().Draw(t, "step"),
			Generation: rapid.Uint64().Draw(t, "gen"),
			Loads:      rapid.SliceOfN(rapid.Custom(genTransfer), 0, 3).Draw(t, "loads"),
			Saves:      rapid.SliceOfN(rapid.Custom(genTransfer), 0, 3).Draw(t, "saves"),
		}
		b, err := m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var got connector.Metadata
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("UnmarshalBinary(MarshalBinary(m)): %v", err)
		}
		if diff := cmp.Diff(m, got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round trip mismatch (-want +got):\n%s", diff)
		}
	})
}

func TestOutputRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		o := connector.Output{Rank: int(rapid.Int32().Draw(t, "rank"))}
		o.Done = rapid.SliceOfN(rapid.Uint64(), 0, 5).Draw(t, "done")
		for range rapid.IntRange(0, 5).Draw(t, "nfailed") {
			o.Failed = append(o.Failed, connector.Failure{
				Transfer: rapid.Uint64().Draw(t, "transfer"),
				Index:    int(rapid.Int32().Draw(t, "index")),
				Reason:   connector.Reason(rapid.IntRange(1, 6).Draw(t, "reason")),
			})
		}
		b, err := o.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var got connector.Output
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("UnmarshalBinary(MarshalBinary(o)): %v", err)
		}
		if diff := cmp.Diff(o, got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round trip mismatch (-want +got):\n%s", diff)
		}
	})
}

// hashes returns n distinct block hashes, seeded by seed.
func hashes(seed byte, n int) []hashing.BlockHash {
	hs := make([]hashing.BlockHash, n)
	for i := range hs {
		for j := range hs[i] {
			hs[i][j] = seed + byte(i*31+j*7)
		}
	}
	return hs
}

func blocks(first connector.BlockID, n int) []connector.BlockID {
	bs := make([]connector.BlockID, n)
	for i := range bs {
		bs[i] = first + connector.BlockID(i)
	}
	return bs
}

// sampleMetadata returns Metadata of every shape a step plans.
func sampleMetadata() []struct {
	name string
	m    connector.Metadata
} {
	load := connector.Transfer{ID: 11, Req: "req-0001", First: 0, Blocks: blocks(40, 3), Hashes: hashes(1, 3)}
	save := connector.Transfer{ID: 12, Req: "req-0002", First: 2, Blocks: blocks(7, 2), Hashes: hashes(2, 2)}
	return []struct {
		name string
		m    connector.Metadata
	}{
		{"empty", connector.Metadata{Step: 1}},
		{"loads", connector.Metadata{Step: 5, Generation: 1, Loads: []connector.Transfer{load, {ID: 13, Req: "r", Blocks: blocks(0, 1), Hashes: hashes(3, 1)}}}},
		{"saves", connector.Metadata{Step: 6, Generation: 1, Saves: []connector.Transfer{save}}},
		{"loads and saves", connector.Metadata{Step: 7, Generation: 1, Loads: []connector.Transfer{load}, Saves: []connector.Transfer{save}}},
		{"rotation", connector.Metadata{Step: 8, Generation: 2, Saves: []connector.Transfer{save}}},
		{"params", connector.Metadata{Step: 9, Generation: 2, Loads: []connector.Transfer{{ID: 14, Req: "p", Blocks: blocks(3, 1), Hashes: hashes(6, 1), Params: []byte(`{"v":2}`)}}}},
		{"big numbers", connector.Metadata{Step: math.MaxUint64, Generation: math.MaxUint64 - 1,
			Loads: []connector.Transfer{{ID: math.MaxUint64, Req: "req-ffff", First: math.MaxInt32, Blocks: []connector.BlockID{math.MaxInt32, 1 << 20}, Hashes: hashes(4, 2)}},
			Saves: []connector.Transfer{{ID: 1 << 40, Req: "", First: 1 << 30, Blocks: []connector.BlockID{1 << 24}, Hashes: hashes(5, 1)}}}},
	}
}

// sampleOutputs returns Outputs of ranks 0 to 3, with done transfers and
// failures of every reason.
func sampleOutputs() []struct {
	name string
	o    connector.Output
} {
	var out []struct {
		name string
		o    connector.Output
	}
	reasons := []connector.Reason{connector.ReasonIO, connector.ReasonNotFound, connector.ReasonNoSpace, connector.ReasonStale, connector.ReasonCanceled, connector.ReasonCorrupt}
	for rank := range 4 {
		o := connector.Output{Rank: rank, Done: []uint64{uint64(rank) + 1, 1 << 33}}
		for i, r := range reasons[rank:] {
			o.Failed = append(o.Failed, connector.Failure{Transfer: uint64(rank) + 1, Index: i * 100, Reason: r})
		}
		out = append(out, struct {
			name string
			o    connector.Output
		}{fmt.Sprintf("rank %d", rank), o})
	}
	return append(out, struct {
		name string
		o    connector.Output
	}{"nothing done", connector.Output{Rank: 2}})
}

// frame is one encoded sample and the decoder of its kind.
type frame struct {
	name   string
	b      []byte
	decode func([]byte) error
}

func sampleFrames(t testing.TB) []frame {
	t.Helper()
	var fs []frame
	for _, s := range sampleMetadata() {
		b, err := s.m.MarshalBinary()
		if err != nil {
			t.Fatalf("%s: MarshalBinary: %v", s.name, err)
		}
		fs = append(fs, frame{"metadata " + s.name, b, func(b []byte) error { var m connector.Metadata; return m.UnmarshalBinary(b) }})
	}
	for _, s := range sampleOutputs() {
		b, err := s.o.MarshalBinary()
		if err != nil {
			t.Fatalf("%s: MarshalBinary: %v", s.name, err)
		}
		fs = append(fs, frame{"output " + s.name, b, func(b []byte) error { var o connector.Output; return o.UnmarshalBinary(b) }})
	}
	return fs
}

func TestWireSamplesRoundTrip(t *testing.T) {
	for _, s := range sampleMetadata() {
		b, err := s.m.MarshalBinary()
		if err != nil {
			t.Fatalf("%s: MarshalBinary: %v", s.name, err)
		}
		var got connector.Metadata
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("%s: UnmarshalBinary: %v", s.name, err)
		}
		if diff := cmp.Diff(s.m, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: round trip (-want +got):\n%s", s.name, diff)
		}
	}
	for _, s := range sampleOutputs() {
		b, err := s.o.MarshalBinary()
		if err != nil {
			t.Fatalf("%s: MarshalBinary: %v", s.name, err)
		}
		var got connector.Output
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("%s: UnmarshalBinary: %v", s.name, err)
		}
		if diff := cmp.Diff(s.o, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: round trip (-want +got):\n%s", s.name, diff)
		}
	}
}

// TestWireEveryByteChange changes every byte of every sample frame to each
// of its 255 other values and wants each change refused, for the reason
// that the part of the frame it falls in gives.
func TestWireEveryByteChange(t *testing.T) {
	for _, f := range sampleFrames(t) {
		t.Run(f.name, func(t *testing.T) {
			kind, _, _ := strings.Cut(f.name, " ")
			b := bytes.Clone(f.b)
			bad := 0
			for i := range b {
				var want string
				switch {
				case i < 3:
					want = "bad magic"
				case i == 3:
					want = "wire version"
				case i < 8:
					want = "length"
				default: // body and checksum
					want = "checksum mismatch"
				}
				orig := b[i]
				for v := range 256 {
					if byte(v) == orig {
						continue
					}
					b[i] = byte(v)
					err := f.decode(b)
					if !errors.Is(err, connector.ErrBadMetadata) || !strings.Contains(err.Error(), kind+" frame") || !strings.Contains(err.Error(), want) {
						if bad++; bad <= 5 {
							t.Errorf("byte %d of %d changed %#02x -> %#02x: UnmarshalBinary = %v, want ErrBadMetadata naming the %s frame and %q", i, len(b), orig, v, err, kind, want)
						}
					}
				}
				b[i] = orig
			}
			if bad > 5 {
				t.Errorf("%d changes not refused as they should be in all", bad)
			}
			if err := f.decode(b); err != nil {
				t.Fatalf("UnmarshalBinary(restored frame) = %v", err)
			}
		})
	}
}

// TestWireRandomCorruption flips 1 to 3 random bytes of 400 random
// Metadata frames and one byte of 200 random Output frames, with a fixed
// seed, and wants every one refused. (A change of 2 or 3 bytes far apart
// escapes a CRC-32 with probability about 2^-32: with this seed, none
// does.)
func TestWireRandomCorruption(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	transfers := func() []connector.Transfer {
		ts := make([]connector.Transfer, rng.IntN(4))
		for i := range ts {
			n := 1 + rng.IntN(16)
			ts[i] = connector.Transfer{ID: rng.Uint64(), Req: connector.RequestID(fmt.Sprintf("req-%d", rng.IntN(1000))), First: rng.IntN(64),
				Blocks: blocks(connector.BlockID(rng.IntN(1<<16)), n), Hashes: hashes(byte(rng.Uint32()), n)}
		}
		return ts
	}
	flip := func(b []byte, n int) {
		for range n {
			b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
		}
	}
	accepted := 0
	for i := range 400 {
		m := connector.Metadata{Step: rng.Uint64N(1 << 40), Generation: rng.Uint64N(4), Loads: transfers(), Saves: transfers()}
		b := mustMarshal(t, &m)
		flip(b, 1+i%3)
		var got connector.Metadata
		if err := got.UnmarshalBinary(b); !errors.Is(err, connector.ErrBadMetadata) {
			accepted++
			t.Errorf("Metadata frame %d with %d bytes flipped: UnmarshalBinary = %v, want ErrBadMetadata", i, 1+i%3, err)
		}
	}
	for i := range 200 {
		o := connector.Output{Rank: rng.IntN(8), Done: make([]uint64, rng.IntN(8))}
		for j := range o.Done {
			o.Done[j] = rng.Uint64()
			if rng.IntN(2) == 0 {
				o.Failed = append(o.Failed, connector.Failure{Transfer: o.Done[j], Index: rng.IntN(16), Reason: connector.Reason(1 + rng.IntN(5))})
			}
		}
		b := mustMarshal(t, &o)
		flip(b, 1)
		var got connector.Output
		if err := got.UnmarshalBinary(b); !errors.Is(err, connector.ErrBadMetadata) {
			accepted++
			t.Errorf("Output frame %d with a byte flipped: UnmarshalBinary = %v, want ErrBadMetadata", i, err)
		}
	}
	if accepted > 0 {
		t.Errorf("%d of 600 corrupted frames accepted", accepted)
	}
}

// TestWireTruncatedAndExtended cuts every sample frame at every length and
// appends bytes to it, also with the length field fixed up to match.
func TestWireTruncatedAndExtended(t *testing.T) {
	for _, f := range sampleFrames(t) {
		t.Run(f.name, func(t *testing.T) {
			for n := range len(f.b) {
				if err := f.decode(f.b[:n]); !errors.Is(err, connector.ErrBadMetadata) {
					t.Errorf("UnmarshalBinary(first %d of %d bytes) = %v, want ErrBadMetadata", n, len(f.b), err)
				}
			}
			for _, tail := range [][]byte{{0}, {0xff}, {1, 2, 3, 4}, f.b} {
				long := append(bytes.Clone(f.b), tail...)
				if err := f.decode(long); !errors.Is(err, connector.ErrBadMetadata) || !strings.Contains(err.Error(), "appended") {
					t.Errorf("UnmarshalBinary(frame + %d bytes) = %v, want ErrBadMetadata saying bytes were appended", len(tail), err)
				}
				// The length fixed up: the checksum no longer matches.
				binary.LittleEndian.PutUint32(long[4:], binary.LittleEndian.Uint32(long[4:])+uint32(len(tail)))
				if err := f.decode(long); !errors.Is(err, connector.ErrBadMetadata) || !strings.Contains(err.Error(), "checksum mismatch") {
					t.Errorf("UnmarshalBinary(frame + %d bytes, length fixed) = %v, want a checksum mismatch", len(tail), err)
				}
			}
		})
	}
}

// TestWireChecksum checks every sample frame's trailer against CRC-32
// (IEEE) of all the bytes before it, computed here with hash/crc32, and its
// length field against its size.
func TestWireChecksum(t *testing.T) {
	for _, f := range sampleFrames(t) {
		end := len(f.b) - 4
		if got, want := binary.LittleEndian.Uint32(f.b[end:]), crc32.ChecksumIEEE(f.b[:end]); got != want {
			t.Errorf("%s: checksum = %#08x, want CRC-32 %#08x", f.name, got, want)
		}
		if got, want := binary.LittleEndian.Uint32(f.b[4:]), uint32(len(f.b)-12); got != want {
			t.Errorf("%s: length = %d, want %d", f.name, got, want)
		}
		if f.b[3] != 4 {
			t.Errorf("%s: version = %d, want 4", f.name, f.b[3])
		}
	}
}

// TestWireGolden pins the encoding: a change to it must come with a new
// wire version (see the versioning policy in metadata.go).
func TestWireGolden(t *testing.T) {
	m := connector.Metadata{Step: 7, Generation: 1, Loads: []connector.Transfer{{ID: 1, Req: "r", Group: 2, First: -1, Blocks: []connector.BlockID{3}, Hashes: make([]hashing.BlockHash, 1), Params: []byte("p")}}}
	o := connector.Output{Rank: 1, Done: []uint64{1}, Failed: []connector.Failure{{Transfer: 1, Index: 0, Reason: connector.ReasonIO}}}
	for _, tt := range []struct {
		name string
		v    interface{ MarshalBinary() ([]byte, error) }
		want string
	}{
		// step gen nloads id nreq "r" group(2) first(-1) nblocks block(3) hash nparams "p" nsaves
		{"metadata", &m, "4b564d04" + "2d000000" + "07010101017204010106" + strings.Repeat("00", 32) + "0170" + "00" + "4b607f42"},
		{"output", &o, "4b564f04" + "07000000" + "02010101010001" + "d5e20f03"},
	} {
		b, err := tt.v.MarshalBinary()
		if err != nil {
			t.Fatalf("%s: MarshalBinary: %v", tt.name, err)
		}
		if got := hex.EncodeToString(b); got != tt.want {
			t.Errorf("%s: MarshalBinary = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestWireOldVersionRefused(t *testing.T) {
	// Frames of wire version 1, which had neither length nor checksum.
	v1meta, _ := hex.DecodeString("4b564d01070101010172000106" + strings.Repeat("00", 32))
	v1out, _ := hex.DecodeString("4b564f0102010101010001")
	// Frames of wire version 2, the golden ones of TestWireGolden before
	// transfers had a group.
	v2meta, _ := hex.DecodeString("4b564d02" + "2a000000" + "070101010172010106" + strings.Repeat("00", 32) + "00" + "4e7bfdfe")
	v2out, _ := hex.DecodeString("4b564f02" + "07000000" + "02010101010001" + "354732ec")
	// Frames of wire version 3, the golden ones of TestWireGolden before
	// transfers had params.
	v3meta, _ := hex.DecodeString("4b564d03" + "2b000000" + "07010101017204010106" + strings.Repeat("00", 32) + "00" + "7753b721")
	v3out, _ := hex.DecodeString("4b564f03" + "07000000" + "02010101010001" + "5a0b9777")
	for _, f := range []struct {
		v         int
		meta, out []byte
	}{{1, v1meta, v1out}, {2, v2meta, v2out}, {3, v3meta, v3out}} {
		var m connector.Metadata
		err := m.UnmarshalBinary(f.meta)
		want := fmt.Sprintf("wire version %d is no longer accepted: re-encode with version 4", f.v)
		if !errors.Is(err, connector.ErrBadMetadata) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "metadata frame") {
			t.Errorf("Metadata.UnmarshalBinary(version %d) = %v, want ErrBadMetadata with %q", f.v, err, want)
		}
		var o connector.Output
		err = o.UnmarshalBinary(f.out)
		if !errors.Is(err, connector.ErrBadMetadata) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "output frame") {
			t.Errorf("Output.UnmarshalBinary(version %d) = %v, want ErrBadMetadata with %q", f.v, err, want)
		}
	}
}

func TestMetadataRejects(t *testing.T) {
	good, err := (&connector.Metadata{Step: 1, Loads: []connector.Transfer{{ID: 1, Req: "r", Blocks: []connector.BlockID{3}, Hashes: make([]hashing.BlockHash, 1)}}}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	out, err := (&connector.Output{Rank: 1, Done: []uint64{1}}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	withVersion := func(v byte) []byte { b := bytes.Clone(good); b[3] = v; return b }
	// good with its group, the varint after id 1 and "r", made -1 (zig-zag
	// 1), and the checksum made again.
	negGroup := bytes.Clone(good[:len(good)-4])
	if negGroup[8+2+1+1+1+1] != 0 {
		t.Fatalf("group byte of %x is %#x, want 0", good, negGroup[14])
	}
	negGroup[14] = 1
	negGroup = binary.LittleEndian.AppendUint32(negGroup, crc32.ChecksumIEEE(negGroup))
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "bad magic"},
		{"magic only", good[:3], "truncated: 3 bytes"},
		{"short magic", good[:2], `bad magic "KV", want "KVM"`},
		{"magic", append([]byte("XXX"), good[3:]...), "bad magic"},
		{"an output frame", out, `bad magic "KVO", want "KVM"`},
		{"negative group", negGroup, "transfer 1: group -1, want >= 0"},
		{"version 0", withVersion(0), "unknown wire version 0, want 4"},
		{"version 5", withVersion(5), "unknown wire version 5, want 4"},
		{"header only", good[:8], "truncated: 8 bytes"},
		{"truncated", good[:len(good)-1], "truncated: length"},
		{"trailing", append(bytes.Clone(good), 0), "1 bytes appended"},
		{"checksum", append(bytes.Clone(good[:len(good)-4]), 0, 0, 0, 0), "checksum mismatch: expected 0x00000000 (in the frame), computed 0x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := connector.Metadata{Step: 9, Generation: 9, Loads: make([]connector.Transfer, 1)}
			err := m.UnmarshalBinary(tt.data)
			if !errors.Is(err, connector.ErrBadMetadata) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("UnmarshalBinary = %v, want ErrBadMetadata containing %q", err, tt.want)
			}
			if diff := cmp.Diff(connector.Metadata{}, m, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Metadata after a failed UnmarshalBinary, want empty (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEncodeRejects(t *testing.T) {
	big := int64(math.MaxInt32)
	big++
	tests := []struct {
		name string
		v    interface {
			AppendBinary([]byte) ([]byte, error)
		}
		want string
	}{
		{"hashes", &connector.Metadata{Saves: []connector.Transfer{{ID: 1, Blocks: []connector.BlockID{1, 2}, Hashes: make([]hashing.BlockHash, 1)}}}, "transfer 1 has 2 blocks but 1 hashes"},
		{"first", &connector.Metadata{Loads: []connector.Transfer{{ID: 2, First: int(-big - 1)}}}, "transfer 2 has First = -2147483649"},
		{"negative group", &connector.Metadata{Saves: []connector.Transfer{{ID: 4, Group: -1}}}, "transfer 4 has Group = -1"},
		{"group", &connector.Metadata{Loads: []connector.Transfer{{ID: 5, Group: int(big)}}}, "transfer 5 has Group = 2147483648"},
		{"rank", &connector.Output{Rank: int(big)}, "Output.Rank = 2147483648"},
		{"index", &connector.Output{Failed: []connector.Failure{{Transfer: 3, Index: int(big)}}}, "failure of transfer 3 has Index = 2147483648"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if strconv.IntSize == 32 && tt.name != "hashes" && tt.name != "negative group" {
				t.Skip("int is 32 bits: every value fits the wire")
			}
			prefix := []byte("keep")
			b, err := tt.v.AppendBinary(prefix)
			if !errors.Is(err, connector.ErrBadMetadata) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("AppendBinary = %v, want ErrBadMetadata containing %q", err, tt.want)
			}
			if string(b) != "keep" {
				t.Errorf("AppendBinary(%q) returned %q on error, want the input unchanged", prefix, b)
			}
		})
	}
}

func TestAppendBinaryAllocs(t *testing.T) {
	samples := sampleMetadata()
	m := samples[len(samples)-1].m
	o := sampleOutputs()[0].o
	buf := make([]byte, 0, 4096)
	if n := testing.AllocsPerRun(100, func() { buf, _ = m.AppendBinary(buf[:0]) }); n != 0 {
		t.Errorf("Metadata.AppendBinary into a buffer with room: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { buf, _ = o.AppendBinary(buf[:0]) }); n != 0 {
		t.Errorf("Output.AppendBinary into a buffer with room: %v allocations, want 0", n)
	}
}

// FuzzMetadata decodes arbitrary bytes as a Metadata and as an Output
// frame: decoding never panics, refusals wrap ErrBadMetadata, and what
// decodes re-encodes to a frame that decodes to the same value and
// encodes to the same bytes. Random bytes rarely pass the checksum;
// FuzzWireBody (in the package's internal tests) fuzzes the bodies behind a
// valid one.
func FuzzMetadata(f *testing.F) {
	for _, fr := range sampleFrames(f) {
		f.Add(fr.b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var m connector.Metadata
		if err := m.UnmarshalBinary(data); err == nil {
			again := mustMarshal(t, &m)
			var m2 connector.Metadata
			if err := m2.UnmarshalBinary(again); err != nil {
				t.Fatalf("decode of re-encoding: %v", err)
			}
			if diff := cmp.Diff(m, m2, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("metadata re-encoding decodes differently (-first +second):\n%s", diff)
			}
			if !bytes.Equal(again, mustMarshal(t, &m2)) {
				t.Fatalf("metadata encoding not stable")
			}
		} else if !errors.Is(err, connector.ErrBadMetadata) {
			t.Fatalf("Metadata.UnmarshalBinary error %v does not wrap ErrBadMetadata", err)
		}
		var o connector.Output
		if err := o.UnmarshalBinary(data); err == nil {
			again := mustMarshal(t, &o)
			var o2 connector.Output
			if err := o2.UnmarshalBinary(again); err != nil {
				t.Fatalf("decode of re-encoding: %v", err)
			}
			if diff := cmp.Diff(o, o2, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("output re-encoding decodes differently (-first +second):\n%s", diff)
			}
		} else if !errors.Is(err, connector.ErrBadMetadata) {
			t.Fatalf("Output.UnmarshalBinary error %v does not wrap ErrBadMetadata", err)
		}
	})
}

func mustMarshal(t *testing.T, v interface{ MarshalBinary() ([]byte, error) }) []byte {
	t.Helper()
	b, err := v.MarshalBinary()
	if err != nil {
		t.Fatalf("MarshalBinary: %v", err)
	}
	return b
}
