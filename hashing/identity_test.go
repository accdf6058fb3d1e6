package hashing

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

func TestIdentityValidate(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*Identity)
		field string // "" = valid
		value string
	}{
		{"valid", func(*Identity) {}, "", ""},
		{"valid mla", func(id *Identity) {
			id.Format.MLADType = FP8E4M3
			id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 1, 8, 8
		}, "", ""},
		{"valid mla tp 1", func(id *Identity) {
			id.Format.MLADType = BF16
			id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 1, 1, 1
		}, "", ""},
		{"mla with several heads", func(id *Identity) {
			id.Format.MLADType = FP8E4M3
			id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 8, 8, 8
		}, "Layout.KVHeads", "8"},
		{"mla without replication", func(id *Identity) {
			id.Format.MLADType = FP8E4M3
			id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 1, 8, 1
		}, "Layout.Replication", "1"},
		{"mla with half replication", func(id *Identity) {
			id.Format.MLADType = BF16
			id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 2, 8, 4
		}, "Layout.KVHeads", "2"},
		{"valid replicated heads", func(id *Identity) { id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 2, 8, 4 }, "", ""},
		{"valid tenant chars", func(id *Identity) { id.Tenant = "Team-1.prod_a" }, "", ""},
		{"empty tenant", func(id *Identity) { id.Tenant = "" }, "Tenant", `""`},
		{"tenant with slash", func(id *Identity) { id.Tenant = "a/b" }, "Tenant", `"a/b"`},
		{"tenant with space", func(id *Identity) { id.Tenant = "a b" }, "Tenant", `"a b"`},
		{"tenant starting with dot", func(id *Identity) { id.Tenant = ".a" }, "Tenant", `".a"`},
		{"tenant too long", func(id *Identity) { id.Tenant = strings.Repeat("a", 65) }, "Tenant", ""},
		{"empty model", func(id *Identity) { id.Model = "" }, "Model", `""`},
		{"model with newline", func(id *Identity) { id.Model = "a\nb" }, "Model", `"a\nb"`},
		{"model not utf8", func(id *Identity) { id.Model = "\xff" }, "Model", `"\xff"`},
		{"empty weights version", func(id *Identity) { id.WeightsVersion = "" }, "WeightsVersion", `""`},
		{"empty device", func(id *Identity) { id.Format.Device = "" }, "Format.Device", `""`},
		{"device with index", func(id *Identity) { id.Format.Device = "cuda:0" }, "Format.Device", `"cuda:0"`},
		{"device upper case", func(id *Identity) { id.Format.Device = "CUDA" }, "Format.Device", `"CUDA"`},
		{"model dtype auto", func(id *Identity) { id.Format.ModelDType = "auto" }, "Format.ModelDType", `"auto"`},
		{"kv dtype empty", func(id *Identity) { id.Format.KVDType = "" }, "Format.KVDType", `""`},
		{"kv dtype auto", func(id *Identity) { id.Format.KVDType = "auto" }, "Format.KVDType", `"auto"`},
		{"kv dtype alias", func(id *Identity) { id.Format.KVDType = "float16" }, "Format.KVDType", `"float16"`},
		{"kv dtype fp8", func(id *Identity) { id.Format.KVDType = "fp8" }, "Format.KVDType", `"fp8"`},
		{"kv dtype unknown", func(id *Identity) { id.Format.KVDType = "fp7" }, "Format.KVDType", `"fp7"`},
		{"mla dtype unknown", func(id *Identity) { id.Format.MLADType = "latent" }, "Format.MLADType", `"latent"`},
		{"kv quant with space", func(id *Identity) { id.Format.KVQuant = "per token" }, "Format.KVQuant", `"per token"`},
		{"no layers", func(id *Identity) { id.Layout.Layers = 0 }, "Layout.Layers", "0"},
		{"negative heads", func(id *Identity) { id.Layout.KVHeads = -8 }, "Layout.KVHeads", "-8"},
		{"head dim too big", func(id *Identity) { id.Layout.HeadDim = 1 << 17 }, "Layout.HeadDim", "131072"},
		{"block size 0", func(id *Identity) { id.Layout.BlockSize = 0 }, "Layout.BlockSize", "0"},
		{"block size too big", func(id *Identity) { id.Layout.BlockSize = 8192 }, "Layout.BlockSize", "8192"},
		{"tp 0", func(id *Identity) { id.Layout.TPSize = 0 }, "Layout.TPSize", "0"},
		{"replication 0", func(id *Identity) { id.Layout.Replication = 0 }, "Layout.Replication", "0"},
		{"replication not dividing tp", func(id *Identity) { id.Layout.TPSize, id.Layout.Replication = 8, 3 }, "Layout.Replication", "3"},
		{"replication above tp", func(id *Identity) { id.Layout.TPSize, id.Layout.Replication = 2, 4 }, "Layout.Replication", "4"},
		{"shards not splitting heads", func(id *Identity) { id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 2, 8, 1 }, "Layout.Replication", "1"},
		{"heads not divisible", func(id *Identity) { id.Layout.KVHeads, id.Layout.TPSize = 6, 4 }, "Layout.Replication", "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := validIdentity()
			tt.edit(&id)
			err := id.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Validate() = %v, want a *FieldError for %s", err, tt.field)
			}
			if fe.Field != tt.field || tt.value != "" && fe.Value != tt.value {
				t.Errorf("Validate() field, value = %s, %s; want %s, %s (%v)", fe.Field, fe.Value, tt.field, tt.value, err)
			}
			if _, err2 := id.Namespace(); err2 == nil || err2.Error() != err.Error() {
				t.Errorf("Namespace() error = %v, want %v", err2, err)
			}
			if b, err2 := id.MarshalBinary(); b != nil || err2 == nil {
				t.Errorf("MarshalBinary() = %x, %v; want an error", b, err2)
			}
		})
	}
}

func TestIdentityValidateReportsAll(t *testing.T) {
	err := Identity{}.Validate()
	for _, field := range []string{"Tenant", "Model", "WeightsVersion", "Format.Device", "Format.ModelDType",
		"Format.KVDType", "Layout.Layers", "Layout.KVHeads", "Layout.HeadDim", "Layout.BlockSize", "Layout.TPSize", "Layout.Replication"} {
		if !strings.Contains(err.Error(), "hashing: "+field+" = ") {
			t.Errorf("Validate of the zero Identity does not name %s:\n%v", field, err)
		}
	}
}

func TestValidateMessages(t *testing.T) {
	id := validIdentity()
	id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 2, 8, 1
	id.Format.KVDType = "auto"
	got := id.Validate().Error()
	for _, want := range []string{
		`hashing: Format.KVDType = "auto": not a dtype`,
		"hashing: Layout.Replication = 1: gives 8 shards (TPSize 8 / Replication 1), which do not split Layout.KVHeads 2 evenly; with fewer KV heads than ranks, Replication is usually TPSize/KVHeads = 4",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Validate() = %q\nwant it to contain %q", got, want)
		}
	}
}

func TestValidateMLAMessages(t *testing.T) {
	id := validIdentity()
	id.Format.MLADType = FP8E4M3
	id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 2, 8, 4
	got := id.Validate().Error()
	for _, want := range []string{
		`hashing: Layout.KVHeads = 2: must be 1 with MLA (Format.MLADType "fp8_e4m3")`,
		`hashing: Layout.Replication = 4: must equal Layout.TPSize 8 with MLA (Format.MLADType "fp8_e4m3")`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Validate() = %q\nwant it to contain %q", got, want)
		}
	}
	// Without MLA the same layout is valid: 2 shards of one KV head each.
	id.Format.MLADType = ""
	if err := id.Validate(); err != nil {
		t.Errorf("Validate() of the layout without MLA = %v, want nil", err)
	}
}

func TestIdentityBinaryRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		id := genIdentity().Draw(t, "identity")
		b, err := id.MarshalBinary()
		if err != nil {
			t.Fatalf("MarshalBinary: %v", err)
		}
		if want := refIdentityEncoding(id); !bytes.Equal(b, want) {
			t.Fatalf("MarshalBinary = %x, want (reference) %x", b, want)
		}
		var got Identity
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("UnmarshalBinary(MarshalBinary(id)): %v", err)
		}
		// The default layout decodes without groups, however it was given.
		want := id
		if want.Layout.isDefaultGroups() {
			want.Layout.Groups = nil
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("round trip (-want +got):\n%s", diff)
		}
		if !got.Equal(id) || !id.Equal(got) {
			t.Fatalf("the decoded identity is not Equal to the encoded one")
		}
	})
}

func TestIdentityUnmarshalErrors(t *testing.T) {
	good, err := validIdentity().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	invalid := validIdentity()
	invalid.Layout.Replication = 3
	badValue := invalid.appendEncoding(nil)
	hugeLayers := append([]byte(nil), good...)
	copy(hugeLayers[len(good)-28:], []byte{0xff, 0xff, 0xff, 0xff})
	// head is the encoding up to the groups; groups of 32 layers follow.
	head := good[: len(good)-4 : len(good)-4]
	u32 := func(vs ...uint32) []byte {
		var b []byte
		for _, v := range vs {
			b = appendU32(b, v)
		}
		return b
	}
	seq := func(from, to int) []uint32 { // from, from+1, ..., to-1
		var l []uint32
		for i := from; i < to; i++ {
			l = append(l, uint32(i))
		}
		return l
	}
	group := func(kind byte, bs, w, sb uint32, layers []uint32) []byte {
		return append(append([]byte{kind}, u32(bs, w, sb, uint32(len(layers)))...), u32(layers...)...)
	}
	with := func(parts ...[]byte) []byte { return bytes.Join(append([][]byte{head}, parts...), nil) }
	twoGroups := with(u32(2), group(2, 16, 128, 0, seq(0, 16)), group(1, 32, 0, 0, seq(16, 32)))
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "version: truncated"},
		{"version 1", append([]byte{1}, head[1:]...), "version 1, want 2: an encoding of an earlier spec version"},
		{"version 3", append([]byte{3}, good[1:]...), "version 3, want 2"},
		{"kind", append([]byte{2, 2}, good[2:]...), "kind 0x02, want 0x01"},
		{"truncated", good[:len(good)-1], "Layout.Groups count: truncated"},
		{"no groups count", head, "Layout.Groups count: truncated"},
		{"trailing", append(good[:len(good):len(good)], 0), "1 trailing bytes"},
		{"tenant length", append([]byte{2, 1, 0xff, 0xff, 0xff, 0xff}, good[6:]...), "Tenant: length 4294967295 over the limit of 64"},
		{"layers over 2^31", hugeLayers, "Layout.Layers: 4294967295 out of range"},
		{"invalid identity", badValue, "Layout.Replication = 3"},
		{"two groups, trailing", append(twoGroups[:len(twoGroups):len(twoGroups)], 1), "1 trailing bytes"},
		{"two groups, truncated", twoGroups[:len(twoGroups)-1], "Layout.Groups[1].Layers: truncated: 16 layers need 64 bytes, 63 left"},
		{"257 groups", with(u32(257)), "Layout.Groups: 257 groups, more than 256 (MaxGroups)"},
		{"2^32-1 groups", with(u32(math.MaxUint32)), "Layout.Groups: 4294967295 groups, more than 256"},
		{"65537 layers", with(u32(2), group(1, 16, 0, 0, seq(0, 16)), group(1, 16, 0, 0, nil)[:13], u32(65521)), "Layout.Groups[1].Layers: 65521 layers, more than the 65520 left of 65536"},
		{"2^32-1 layers", with(u32(1), group(1, 16, 0, 0, nil)[:13], u32(math.MaxUint32)), "Layout.Groups[0].Layers: 4294967295 layers, more than the 65536 left"},
		{"layer count past the end", with(u32(1), group(1, 16, 0, 0, nil)[:13], u32(1000)), "Layout.Groups[0].Layers: truncated: 1000 layers need 4000 bytes, 0 left"},
		{"window over 2^31", with(u32(1), group(2, 16, 1<<31, 0, seq(0, 32))), "Layout.Groups[0].Window: 2147483648 out of range"},
		{"layer over 2^31", with(u32(1), group(1, 16, 0, 0, []uint32{0, 1 << 31})), "at byte 183: Layout.Groups[0].Layers[1]: 2147483648 out of range"},
		{"explicit default group", with(u32(1), group(1, 16, 0, 0, seq(0, 32))), "Layout.Groups: one full-attention group of every layer at Layout.BlockSize is the default layout, encoded as 0 groups"},
		{"unknown kind", with(u32(2), group(7, 16, 0, 0, seq(0, 16)), group(1, 16, 0, 0, seq(16, 32))), "Layout.Groups[0].Kind = 7: unknown group kind"},
		{"kind 0", with(u32(1), group(0, 16, 0, 0, seq(0, 32))), "Layout.Groups[0].Kind = 0: required"},
		{"layer in no group", with(u32(1), group(1, 16, 0, 0, seq(0, 31))), "Layout.Groups = 1 group: layer 31 of Layout.Layers 32 is in no group"},
	}
	if err := new(Identity).UnmarshalBinary(twoGroups); err != nil {
		t.Fatalf("the two groups of the test do not decode: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := validIdentity()
			id.Model = "unchanged"
			before := id
			err := id.UnmarshalBinary(tt.data)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("UnmarshalBinary = %v, want an error containing %q", err, tt.want)
			}
			// Validation errors name a value ("Field = value: ..."); the
			// decoder's own wrap ErrMalformedIdentity.
			var fe *FieldError
			if validation := strings.Contains(tt.want, " = "); validation && !errors.As(err, &fe) || !validation && !errors.Is(err, ErrMalformedIdentity) {
				t.Errorf("error %v: want a *FieldError for a validation error, one wrapping ErrMalformedIdentity for the bytes", err)
			}
			if diff := cmp.Diff(before, id); diff != "" {
				t.Errorf("UnmarshalBinary changed the identity on error (-before +after):\n%s", diff)
			}
		})
	}
}

func TestNamespace(t *testing.T) {
	id := validIdentity()
	ns, err := id.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	ns2, _ := id.Namespace()
	if ns != ns2 {
		t.Errorf("Namespace is not deterministic: %v, %v", ns, ns2)
	}
	enc, _ := id.MarshalBinary()
	if ns.Digest() != [32]byte(digestOf(enc)) {
		t.Errorf("Digest is not BLAKE3 of the encoding")
	}
	if ns.Tenant() != "acme" || len(ns.ID()) != IDLen || ns.Prefix() != "acme/"+ns.ID()+"/" || ns.String() != "acme/"+ns.ID() {
		t.Errorf("Tenant, ID, Prefix, String = %q, %q, %q, %q", ns.Tenant(), ns.ID(), ns.Prefix(), ns.String())
	}
	if ns.BlockSize() != 16 || ns.Shards() != 2 || ns.IsZero() {
		t.Errorf("BlockSize, Shards, IsZero = %d, %d, %v", ns.BlockSize(), ns.Shards(), ns.IsZero())
	}
	rot := id.Rotate()
	if rot.Generation != 1 || id.Generation != 0 {
		t.Errorf("Rotate: generation %d (original now %d), want 1 (0)", rot.Generation, id.Generation)
	}
	nsRot, _ := rot.Namespace()
	if nsRot.ID() == ns.ID() || nsRot.Tenant() != ns.Tenant() {
		t.Errorf("rotated namespace %v, original %v: want a new ID, same tenant", nsRot, ns)
	}
	var zero Namespace
	if !zero.IsZero() || zero.Prefix() != "" || zero.Shards() != 0 {
		t.Errorf("zero Namespace: IsZero, Prefix, Shards = %v, %q, %d", zero.IsZero(), zero.Prefix(), zero.Shards())
	}
}

// digestOf is BLAKE3 of b.
func digestOf(b []byte) BlockHash { return blake3Sum(b) }

func TestRotatePanicsAtMax(t *testing.T) {
	id := validIdentity()
	id.Generation = math.MaxUint64
	defer func() {
		if recover() == nil {
			t.Error("Rotate at the largest generation did not panic")
		}
	}()
	id.Rotate()
}

func TestIdentityJSON(t *testing.T) {
	in := `{"tenant":"acme","model":"m","weights_version":"v1","generation":3,
	"format":{"device":"cuda","model_dtype":"bfloat16","kv_dtype":"float8_e4m3fn"},
	"layout":{"layers":2,"kv_heads":1,"head_dim":64,"block_size":16,"tp_size":4,"replication":4}}`
	var id Identity
	if err := json.Unmarshal([]byte(in), &id); err != nil {
		t.Fatal(err)
	}
	want := Identity{Tenant: "acme", Model: "m", WeightsVersion: "v1", Generation: 3,
		Format: Format{Device: "cuda", ModelDType: BF16, KVDType: FP8E4M3},
		Layout: Layout{Layers: 2, KVHeads: 1, HeadDim: 64, BlockSize: 16, TPSize: 4, Replication: 4}}
	if diff := cmp.Diff(want, id); diff != "" {
		t.Errorf("json.Unmarshal (-want +got):\n%s", diff)
	}
	if err := json.Unmarshal([]byte(`{"format":{"kv_dtype":"auto"}}`), &id); err == nil || !strings.Contains(err.Error(), `"auto"`) {
		t.Errorf("json.Unmarshal of kv_dtype auto: %v, want an error naming it", err)
	}
	// An empty dtype is no dtype, as an absent one: valid for MLA, not for
	// the KV dtype.
	id = want
	if err := json.Unmarshal([]byte(`{"format":{"device":"cuda","model_dtype":"bf16","kv_dtype":"fp8_e4m3","mla_dtype":""}}`), &id); err != nil || !id.Equal(want) {
		t.Errorf("json.Unmarshal with mla_dtype \"\" = %v, %+v; want nil, %+v", err, id, want)
	}
	if err := json.Unmarshal([]byte(`{"format":{"kv_dtype":""}}`), &id); err != nil {
		t.Errorf("json.Unmarshal of kv_dtype \"\": %v", err)
	} else if err := id.Validate(); err == nil || !strings.Contains(err.Error(), `Format.KVDType = "": required`) {
		t.Errorf("Validate with kv_dtype \"\" = %v, want Format.KVDType required", err)
	}
}

func TestParseDType(t *testing.T) {
	tests := []struct {
		in   string
		want DType
		err  string
	}{
		{"fp16", FP16, ""}, {"FP16", FP16, ""}, {"float16", FP16, ""}, {"half", FP16, ""},
		{"bfloat16", BF16, ""}, {" bf16 ", BF16, ""}, {"float32", FP32, ""},
		{"float8_e4m3fn", FP8E4M3, ""}, {"fp8_e5m2", FP8E5M2, ""}, {"float8_e4m3fnuz", FP8E4M3FNUZ, ""},
		{"int8", INT8, ""}, {"int4", INT4, ""}, {"fp4_e2m1", FP4E2M1, ""},
		{"auto", "", `"auto": not a dtype`}, {"", "", "not a dtype"},
		{"fp8", "", "ambiguous: say fp8_e4m3"}, {"fp7", "", "unknown dtype (known: fp32, fp16"},
	}
	for _, tt := range tests {
		got, err := ParseDType(tt.in)
		if got != tt.want || (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("ParseDType(%q) = %q, %v; want %q, %q", tt.in, got, err, tt.want, tt.err)
		}
	}
	for _, d := range DTypes() {
		if got, err := ParseDType(d.String()); got != d || err != nil || !d.Known() {
			t.Errorf("ParseDType(%q) = %q, %v; Known = %v", d, got, err, d.Known())
		}
	}
}

// TestNameCharacters pins which model names and weights versions Validate
// accepts, as SPEC.md says: well-formed UTF-8 without a code point of
// category Cc (U+0000-U+001F, U+007F-U+009F), every code point checked.
func TestNameCharacters(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if 0xd800 <= r && r <= 0xdfff {
			continue // surrogates: below, as bytes
		}
		s := "a" + string(r) + "b"
		want := !(r <= 0x1f || 0x7f <= r && r <= 0x9f)
		if got := checkName("Model", s) == nil; got != want {
			t.Errorf("checkName(%q) accepts = %v, want %v", s, got, want)
		}
	}
	for r := 0xd800; r <= 0xdfff; r++ {
		s := string([]byte{0xed, byte(0x80 | r>>6&0x3f), byte(0x80 | r&0x3f)})
		if checkName("Model", s) == nil {
			t.Errorf("checkName accepts the surrogate U+%04X encoded as %x", r, s)
		}
	}
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"space", "Llama 3", true},
		{"no-break space", "a\u00a0b", true},
		{"zero width space", "a\u200bb", true},
		{"right-to-left override", "a\u202eb", true},
		{"line separator", "a\u2028b", true},
		{"byte order mark", "\ufeffa", true},
		{"noncharacter", "a\ufffe", true},
		{"largest code point", "\U0010ffff", true},
		{"CJK", "Qwen/通义千问-7B", true},
		{"NFD", "re\u0301vision", true},
		{"tab", "a\tb", false},
		{"NUL", "a\x00", false},
		{"DEL", "a\x7f", false},
		{"C1 first", "a\u0080", false},
		{"C1 last", "a\u009f", false},
		{"lone continuation byte", "a\x80", false},
		{"overlong slash", "a\xc0\xaf", false},
		{"overlong NUL", "\xc0\x80", false},
		{"above U+10FFFF", "\xf4\x90\x80\x80", false},
		{"truncated", "\xe6\x97", false},
		{"0xff", "\xff", false},
		{"1024 bytes", strings.Repeat("é", 512), true},
		{"1025 bytes", strings.Repeat("é", 512) + "a", false},
	}
	for _, tt := range tests {
		id := validIdentity()
		id.Model, id.WeightsVersion = tt.in, tt.in
		err := id.Validate()
		if (err == nil) != tt.ok {
			t.Errorf("%s: Validate with model and weights version %q = %v, want ok = %v", tt.name, tt.in, err, tt.ok)
		}
		if !tt.ok && (err == nil || !strings.Contains(err.Error(), "hashing: Model = ") || !strings.Contains(err.Error(), "hashing: WeightsVersion = ")) {
			t.Errorf("%s: Validate error %v does not name Model and WeightsVersion", tt.name, err)
		}
	}
	// Never normalised: NFC and NFD spellings are different identities.
	a, b := validIdentity(), validIdentity()
	a.Model, b.Model = "r\u00e9vision", "re\u0301vision"
	na, _ := a.Namespace()
	nb, _ := b.Namespace()
	if na.ID() == nb.ID() {
		t.Errorf("NFC and NFD model names share the namespace %s", na.ID())
	}
}

// TestASCIIFields pins the bytes the tenant, the device and the KV
// quantization policy may hold, every byte value checked in the first and
// in a later position.
func TestASCIIFields(t *testing.T) {
	digit := func(c byte) bool { return '0' <= c && c <= '9' }
	lower := func(c byte) bool { return 'a' <= c && c <= 'z' }
	letter := func(c byte) bool { return lower(c) || 'A' <= c && c <= 'Z' }
	for i := 0; i < 256; i++ {
		c := byte(i)
		for _, tt := range []struct {
			field       string
			check       func(string) error
			first, rest bool
		}{
			{"Tenant", ValidateTenant, letter(c) || digit(c), letter(c) || digit(c) || c == '.' || c == '_' || c == '-'},
			{"Format.Device", checkDevice, lower(c), lower(c) || digit(c) || c == '_'},
			{"Format.KVQuant", checkQuant, 0x21 <= c && c <= 0x7e, 0x21 <= c && c <= 0x7e},
		} {
			if got := tt.check(string(c)+"a") == nil; got != tt.first {
				t.Errorf("%s %q: accepted = %v, want %v", tt.field, string(c)+"a", got, tt.first)
			}
			if got := tt.check("a"+string(c)) == nil; got != tt.rest {
				t.Errorf("%s %q: accepted = %v, want %v", tt.field, "a"+string(c), got, tt.rest)
			}
		}
	}
}
