package hashing

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func FuzzParseKey(f *testing.F) {
	ns := testNamespace(f, nil)
	f.Add(ns.Key(1, BlockHash{1, 2, 3}))
	f.Add("a/" + ns.ID() + "/0/" + BlockHash{}.String())
	hy := testNamespace(f, func(id *Identity) { *id = hybridIdentity() })
	f.Add(hy.GroupKey(1, 1, BlockHash{4, 5}))
	f.Add("a/" + ns.ID() + "/0/g0/" + BlockHash{}.String())
	f.Add("a/" + ns.ID() + "/0/g01/" + BlockHash{}.String())
	f.Add(ns.LayerKey(0, 1, BlockHash{1, 2, 3}, 3, 17))
	f.Add(hy.LayerKey(1, 0, BlockHash{4, 5}, 1, 2))
	f.Add("a/" + ns.ID() + "/0/" + BlockHash{}.String() + "/l0-65536")
	f.Add("a/" + ns.ID() + "/0/" + BlockHash{}.String() + "/l2-2")
	f.Add("a/" + ns.ID() + "/0/" + BlockHash{}.String() + "/l02-3")
	f.Add("a/" + ns.ID() + "/0/g1/" + BlockHash{}.String() + "/L2-3")
	f.Add("a/" + ns.ID() + "/0/l1-2/" + BlockHash{}.String())
	f.Add("a/b/c/d")
	f.Add("a/b/c/d/e")
	f.Add("a//0/")
	f.Add("ab/00000000000000000000000000000000/01/" + BlockHash{}.String())
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		if err != nil {
			if !errors.Is(err, ErrMalformedKey) {
				t.Fatalf("ParseKey(%q) error %v does not wrap ErrMalformedKey", s, err)
			}
			if k != (Key{}) {
				t.Fatalf("ParseKey(%q) = %+v with an error", s, k)
			}
			return
		}
		// Only canonical keys parse: formatting gives back the input.
		if got := k.String(); got != s {
			t.Fatalf("ParseKey(%q).String() = %q", s, got)
		}
		if ValidateTenant(k.Tenant) != nil || k.Rank < 0 || k.Rank > maxShard || len(k.Namespace) != IDLen || k.Group < 0 || k.Group >= MaxGroups ||
			k.Layers != (LayerRange{}) && (k.Layers.Lo < 0 || k.Layers.Lo >= k.Layers.Hi || k.Layers.Hi > maxLayerEnd) {
			t.Fatalf("ParseKey(%q) = %+v, an invalid key", s, k)
		}
	})
}

func FuzzIdentityUnmarshal(f *testing.F) {
	id := validIdentity()
	b, _ := id.MarshalBinary()
	f.Add(b)
	id.Format.MLADType, id.Format.KVQuant = BF16, "group64"
	id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 1, 4, 4
	b, _ = id.MarshalBinary()
	f.Add(b)
	for _, id := range []Identity{hybridIdentity(), stateIdentity(), allStateIdentity()} {
		b, _ = id.MarshalBinary()
		f.Add(b)
	}
	f.Add(refIdentityEncoding(validIdentity())[:10])
	f.Add([]byte{2, 1})
	f.Add([]byte{1, 1, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		var id Identity
		if err := id.UnmarshalBinary(data); err != nil {
			if !reflect.DeepEqual(id, Identity{}) {
				t.Fatalf("UnmarshalBinary wrote %+v and returned %v", id, err)
			}
			return
		}
		// Only canonical encodings of valid identities decode.
		if err := id.Validate(); err != nil {
			t.Fatalf("decoded an invalid identity %+v: %v", id, err)
		}
		got, err := id.MarshalBinary()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("MarshalBinary(UnmarshalBinary(%x)) = %x, %v", data, got, err)
		}
	})
}
