package connector_test

import (
	"bytes"
	"errors"
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
		First: rapid.IntRange(0, 1<<20).Draw(t, "first"),
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
		o := connector.Output{Rank: rapid.IntRange(0, 1<<16).Draw(t, "rank")}
		o.Done = rapid.SliceOfN(rapid.Uint64(), 0, 5).Draw(t, "done")
		for range rapid.IntRange(0, 5).Draw(t, "nfailed") {
			o.Failed = append(o.Failed, connector.Failure{
				Transfer: rapid.Uint64().Draw(t, "transfer"),
				Index:    rapid.IntRange(0, 1<<20).Draw(t, "index"),
				Reason:   connector.Reason(rapid.IntRange(1, 5).Draw(t, "reason")),
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

func TestMetadataRejects(t *testing.T) {
	good, err := (&connector.Metadata{Step: 1, Loads: []connector.Transfer{{ID: 1, Req: "r", Blocks: []connector.BlockID{3}, Hashes: make([]hashing.BlockHash, 1)}}}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"empty":      nil,
		"magic":      append([]byte("XXX"), good[3:]...),
		"version":    append(append([]byte(nil), good[:3]...), append([]byte{9}, good[4:]...)...),
		"truncated":  good[:len(good)-1],
		"trailing":   append(append([]byte(nil), good...), 0),
		"huge count": append(append([]byte(nil), good[:6]...), 0xff, 0xff, 0xff, 0xff, 0x0f),
	}
	for name, b := range cases {
		var m connector.Metadata
		if err := m.UnmarshalBinary(b); !errors.Is(err, connector.ErrBadMetadata) {
			t.Errorf("%s: UnmarshalBinary error = %v, want ErrBadMetadata", name, err)
		}
	}
	bad := connector.Metadata{Saves: []connector.Transfer{{ID: 1, Blocks: []connector.BlockID{1, 2}, Hashes: make([]hashing.BlockHash, 1)}}}
	if _, err := bad.MarshalBinary(); !errors.Is(err, connector.ErrBadMetadata) {
		t.Errorf("MarshalBinary of a transfer with 2 blocks and 1 hash: error = %v, want ErrBadMetadata", err)
	}
}

func FuzzMetadata(f *testing.F) {
	m := connector.Metadata{Step: 3, Generation: 1, Saves: []connector.Transfer{{ID: 9, Req: "req", First: 2, Blocks: []connector.BlockID{5, 6}, Hashes: make([]hashing.BlockHash, 2)}}}
	b, _ := m.MarshalBinary()
	f.Add(b)
	o := connector.Output{Rank: 1, Done: []uint64{9}, Failed: []connector.Failure{{Transfer: 9, Index: 1, Reason: connector.ReasonNoSpace}}}
	ob, _ := o.MarshalBinary()
	f.Add(ob)
	f.Fuzz(func(t *testing.T, data []byte) {
		var m connector.Metadata
		if err := m.UnmarshalBinary(data); err == nil {
			again, err := m.MarshalBinary()
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			var m2 connector.Metadata
			if err := m2.UnmarshalBinary(again); err != nil {
				t.Fatalf("decode of re-encoding: %v", err)
			}
			if !bytes.Equal(again, mustMarshal(t, &m2)) {
				t.Fatalf("encoding not stable")
			}
		}
		var o connector.Output
		if err := o.UnmarshalBinary(data); err == nil {
			if _, err := o.MarshalBinary(); err != nil {
				t.Fatalf("re-encode output: %v", err)
			}
		}
	})
}

func mustMarshal(t *testing.T, m *connector.Metadata) []byte {
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
