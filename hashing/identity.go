package hashing

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/zeebo/blake3"
)

// Identity is everything that changes what the bytes of a stored KV block
// mean, besides the tokens and the request's extras (which the block hash
// covers): who the cache belongs to, which weights computed it, how it is
// encoded and how it is sharded, KV cache groups included. Two engines
// share stored blocks exactly when their identities are equal
// ([Identity.Equal]). [Identity.Namespace] hashes it into the [Namespace]
// that every store key starts with.
//
// The struct tags give the field names of its JSON form, as configuration
// files and testdata/vectors.json write it; dtypes in JSON may use the
// aliases that [ParseDType] accepts (SPEC.md lists them all), and an empty
// string is no dtype, as an absent member is.
type Identity struct {
	// Tenant is the cache prefix that partitions a shared store: 1 to 64
	// bytes of ASCII letters, digits, '.', '_' and '-', starting with a
	// letter or digit. Keys of one tenant never share a prefix with keys of
	// another (see [TenantPrefix]).
	Tenant string `json:"tenant"`
	// Model names the model, such as "meta-llama/Llama-3.1-8B-Instruct":
	// 1 to 1024 bytes of UTF-8 without control characters (Unicode category
	// Cc: U+0000-U+001F and U+007F-U+009F). It is hashed as given, never
	// normalised: NFC and NFD spellings are different models.
	Model string `json:"model"`
	// WeightsVersion names the revision of the weights (a commit hash, a
	// checkpoint tag). Required: without it an updated checkpoint under the
	// same model name would be served its predecessor's KV. The same
	// characters as Model are allowed.
	WeightsVersion string `json:"weights_version"`
	// Generation counts online weight updates; bump it with
	// [Identity.Rotate] after every update so that no older entry is ever
	// read again.
	Generation uint64 `json:"generation"`
	// Format is how the KV bytes are encoded.
	Format Format `json:"format"`
	// Layout is how the KV is laid out and sharded.
	Layout Layout `json:"layout"`
}

// Format is the encoding of the KV bytes.
type Format struct {
	// Device is the device type that holds and computes the cache: 1 to 32
	// lower-case letters, digits and '_', starting with a letter, such as
	// "cuda", "rocm" or "cpu", without a device index.
	Device string `json:"device"`
	// ModelDType is the dtype the model computes in.
	ModelDType DType `json:"model_dtype"`
	// KVDType is the dtype of the KV cache's elements.
	KVDType DType `json:"kv_dtype"`
	// KVQuant names the KV cache's quantization policy where the dtype alone
	// does not say it (scale granularity, group size, calibration), such as
	// "per_token_head" or "group64"; empty for none. Printable ASCII without
	// spaces, at most 256 bytes.
	KVQuant string `json:"kv_quant,omitempty"`
	// MLADType is the dtype of the latent cache of multi-head latent
	// attention (DeepSeek-V2/V3 style); empty when the model does not use
	// MLA. With MLA, Layout.KVHeads must be 1 and Layout.Replication must
	// equal Layout.TPSize.
	MLADType DType `json:"mla_dtype,omitempty"`
}

// Layout is the shape and shard schema of the KV cache.
type Layout struct {
	Layers  int `json:"layers"`   // layers that hold KV or state, 1 to 65536
	KVHeads int `json:"kv_heads"` // KV heads of the whole model's attention layers (exactly 1 for MLA), 1 to 65536
	HeadDim int `json:"head_dim"` // elements per head, 1 to 65536
	// BlockSize is the block size of the hash chain in tokens, 1 to
	// MaxBlockSize: the block size of the whole cache when Groups is
	// empty, and a divisor of every group's block size otherwise.
	BlockSize int `json:"block_size"`
	TPSize    int `json:"tp_size"` // tensor-parallel ranks, 1 to 65536
	// Replication is how many TP ranks hold the same KV heads (1 when every
	// rank holds its own heads; TPSize/KVHeads when there are fewer KV heads
	// than ranks; exactly TPSize for MLA, whose latent cache every rank
	// holds). It must divide TPSize, and the TPSize/Replication shards must
	// split KVHeads evenly. See [Namespace.Shard].
	Replication int `json:"replication"`
	// Groups are the KV cache groups of a hybrid model (full attention,
	// sliding window, recurrent state), at most [MaxGroups]; every layer is
	// in exactly one. Empty means one full-attention group of every layer
	// at BlockSize, the cache of a model that is not hybrid; the one
	// explicit group that says the same is the same identity (see
	// [Layout.EffectiveGroups]). The order of the groups numbers them in
	// keys ([Namespace.GroupKey]) and is part of the identity. A layout
	// whose groups are all RecurrentState groups has no attention: its
	// KVHeads and HeadDim must be 1 and its Replication its TPSize.
	Groups []Group `json:"groups,omitempty"`
}

// Limits of the identity's fields.
const (
	maxTenantLen   = 64
	maxNameLen     = 1024 // Model, WeightsVersion
	maxDeviceLen   = 32
	maxQuantLen    = 256
	maxLayoutValue = 1 << 16
)

// ValidateTenant reports whether tenant is a valid tenant (see
// [Identity].Tenant), with a [*FieldError] naming the value when it is not.
func ValidateTenant(tenant string) error {
	if tenant == "" {
		return fieldErr("Tenant", tenant, "required: the cache prefix that partitions a shared store")
	}
	if len(tenant) > maxTenantLen {
		return fieldErr("Tenant", tenant, "longer than %d bytes", maxTenantLen)
	}
	for i := 0; i < len(tenant); i++ {
		c := tenant[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if i == 0 && !alnum {
			return fieldErr("Tenant", tenant, "must start with an ASCII letter or digit")
		}
		if !alnum && c != '.' && c != '_' && c != '-' {
			return fieldErr("Tenant", tenant, "byte %q at %d: only ASCII letters, digits, '.', '_' and '-' are allowed", c, i)
		}
	}
	return nil
}

// Validate reports every invalid field of id: an empty tenant, model or
// weights version, a tenant outside its alphabet, an unknown dtype (or
// "auto"), a device with an index, a layout value out of range, a
// replication that does not divide the TP size or a shard count that does
// not divide the KV heads, and for MLA (a non-empty Format.MLADType) KV
// heads other than 1 or a replication other than the TP size. Of the KV
// cache groups (Layout.Groups) it reports more than [MaxGroups], a missing
// or unknown kind, an empty list of layers, a layer out of range, out of
// increasing order or in two groups, a layer in no group, a block size
// that is not a multiple of Layout.BlockSize (or is above [MaxBlockSize]),
// a window missing from a sliding-window group or given to another, state
// bytes missing from a state group or given to another, and for a layout
// of state groups only, KV heads, head dim or replication other than 1, 1
// and the TP size. The error is a [*FieldError], or several joined with
// [errors.Join], each naming the field, such as
// "Layout.Groups[1].Window", and its value.
func (id Identity) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(ValidateTenant(id.Tenant))
	add(checkName("Model", id.Model))
	add(checkName("WeightsVersion", id.WeightsVersion))
	add(checkDevice(id.Format.Device))
	add(checkDType("Format.ModelDType", id.Format.ModelDType, false))
	add(checkDType("Format.KVDType", id.Format.KVDType, false))
	add(checkDType("Format.MLADType", id.Format.MLADType, true))
	add(checkQuant(id.Format.KVQuant))

	l := id.Layout
	ok := true
	rng := func(field string, v, hi int) {
		if v < 1 || v > hi {
			add(fieldErr(field, v, "must be 1 to %d", hi))
			ok = false
		}
	}
	rng("Layout.Layers", l.Layers, maxLayoutValue)
	rng("Layout.KVHeads", l.KVHeads, maxLayoutValue)
	rng("Layout.HeadDim", l.HeadDim, maxLayoutValue)
	rng("Layout.BlockSize", l.BlockSize, MaxBlockSize)
	rng("Layout.TPSize", l.TPSize, maxLayoutValue)
	rng("Layout.Replication", l.Replication, maxLayoutValue)
	checkGroups(l, 1 <= l.Layers && l.Layers <= maxLayoutValue, 1 <= l.BlockSize && l.BlockSize <= MaxBlockSize, add)
	switch {
	case !ok:
	case l.allState():
		// Without attention layers there are no KV heads: one canonical
		// form, whose one attention shard is no shard at all.
		if l.KVHeads != 1 {
			add(fieldErr("Layout.KVHeads", l.KVHeads, "must be 1 when every group is a state group: the layout has no attention layers"))
		}
		if l.HeadDim != 1 {
			add(fieldErr("Layout.HeadDim", l.HeadDim, "must be 1 when every group is a state group: the layout has no attention layers"))
		}
		if l.Replication != l.TPSize {
			add(fieldErr("Layout.Replication", l.Replication, "must equal Layout.TPSize %d when every group is a state group: the layout has no KV heads to replicate (state groups have a shard per rank)", l.TPSize))
		}
	case id.Format.MLADType != "":
		// Multi-head latent attention caches one latent vector per token
		// and layer, shared by all heads, and every TP rank holds all of
		// it: one KV head, one shard.
		if l.KVHeads != 1 {
			add(fieldErr("Layout.KVHeads", l.KVHeads, "must be 1 with MLA (Format.MLADType %s): the latent cache is one vector per token, shared by all heads", quoteTrunc(string(id.Format.MLADType))))
		}
		if l.Replication != l.TPSize {
			add(fieldErr("Layout.Replication", l.Replication, "must equal Layout.TPSize %d with MLA (Format.MLADType %s): every rank holds the same latent cache, so there is one shard", l.TPSize, quoteTrunc(string(id.Format.MLADType))))
		}
	default:
		switch shards := l.TPSize / l.Replication; {
		case l.TPSize%l.Replication != 0:
			add(fieldErr("Layout.Replication", l.Replication, "does not divide Layout.TPSize %d", l.TPSize))
		case l.KVHeads%shards != 0:
			add(fieldErr("Layout.Replication", l.Replication,
				"gives %d shards (TPSize %d / Replication %d), which do not split Layout.KVHeads %d evenly%s",
				shards, l.TPSize, l.Replication, l.KVHeads, replicationHint(l)))
		}
	}
	return joinErrs(errs)
}

// replicationHint suggests the usual replication for a layout.
func replicationHint(l Layout) string {
	if l.KVHeads < l.TPSize && l.TPSize%l.KVHeads == 0 {
		return fmt.Sprintf("; with fewer KV heads than ranks, Replication is usually TPSize/KVHeads = %d", l.TPSize/l.KVHeads)
	}
	return ""
}

// checkName checks Model and WeightsVersion. unicode.IsControl is true for
// exactly the code points of category Cc, U+0000-U+001F and U+007F-U+009F
// (SPEC.md, "Strings of the identity").
func checkName(field, s string) error {
	switch {
	case s == "":
		return fieldErr(field, s, "required")
	case len(s) > maxNameLen:
		return fieldErr(field, s, "longer than %d bytes", maxNameLen)
	case !utf8.ValidString(s):
		return fieldErr(field, s, "not valid UTF-8")
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return fieldErr(field, s, "contains a control character")
	}
	return nil
}

func checkDevice(s string) error {
	const field = "Format.Device"
	if s == "" {
		return fieldErr(field, s, "required, such as \"cuda\" or \"cpu\"")
	}
	if len(s) > maxDeviceLen {
		return fieldErr(field, s, "longer than %d bytes", maxDeviceLen)
	}
	if i := strings.IndexByte(s, ':'); i >= 0 {
		return fieldErr(field, s, "a device type has no index: use %q", s[:i])
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || i > 0 && ('0' <= c && c <= '9' || c == '_')) {
			return fieldErr(field, s, "must be lower-case letters, digits and '_', starting with a letter")
		}
	}
	return nil
}

func checkDType(field string, d DType, optional bool) error {
	if d == "" && optional {
		return nil
	}
	if d.Known() {
		return nil
	}
	if d == "" {
		return fieldErr(field, d, "required")
	}
	return fieldErr(field, d, "%s", dtypeHint(normDType(string(d))))
}

func checkQuant(s string) error {
	if len(s) > maxQuantLen {
		return fieldErr("Format.KVQuant", s, "longer than %d bytes", maxQuantLen)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return fieldErr("Format.KVQuant", s, "byte %q at %d: only printable ASCII without spaces is allowed", s[i], i)
		}
	}
	return nil
}

// Rotate returns id with its generation advanced by one: the identity to use
// after an online weight update. Its namespace differs from id's, so every
// entry stored under id becomes unreachable. Rotate panics if the
// generation is already the largest uint64.
func (id Identity) Rotate() Identity {
	if id.Generation == math.MaxUint64 {
		panic("hashing: Identity.Rotate: generation overflow")
	}
	id.Generation++
	return id
}

// MarshalBinary returns the canonical encoding of id (SPEC.md, "Identity
// encoding"): a version byte, a kind byte, then every field in a fixed
// order, strings length-prefixed and integers little-endian, and the KV
// cache groups last. Identities that are [Identity.Equal] have equal
// encodings and others different ones: a layout's explicit default group
// (see [Layout.EffectiveGroups]) is encoded as no groups. It returns the
// errors of [Identity.Validate].
func (id Identity) MarshalBinary() ([]byte, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	return id.appendEncoding(nil), nil
}

func (id Identity) appendEncoding(b []byte) []byte {
	b = append(b, SpecVersion, kindIdentity)
	b = appendStr(b, id.Tenant)
	b = appendStr(b, id.Model)
	b = appendStr(b, id.WeightsVersion)
	b = appendU64(b, id.Generation)
	f := id.Format
	b = appendStr(b, f.Device)
	b = appendStr(b, string(f.ModelDType))
	b = appendStr(b, string(f.KVDType))
	b = appendStr(b, f.KVQuant)
	b = appendStr(b, string(f.MLADType))
	l := id.Layout
	for _, v := range [...]int{l.Layers, l.KVHeads, l.HeadDim, l.BlockSize, l.TPSize, l.Replication} {
		b = appendU32(b, uint32(v))
	}
	return appendGroups(b, l)
}

// UnmarshalBinary decodes the canonical encoding that MarshalBinary
// returns. It accepts exactly the encodings of valid identities: a wrong
// version or kind, a truncated field, a length over its limit, trailing
// bytes, an explicit default group (errors wrapping [ErrMalformedIdentity])
// or a decoded identity that fails [Identity.Validate] are errors, and
// leave *id unchanged. An encoding of an earlier spec version, such as
// version 1 from before KV cache groups, is an error too: its keys are not
// the ones this package computes. The default layout decodes with
// Layout.Groups nil, so UnmarshalBinary(MarshalBinary(id)) is id, or for
// an id with an explicit default group the identity Equal to it.
func (id *Identity) UnmarshalBinary(data []byte) error {
	d := decoder{b: data}
	if v := d.byte("version"); d.err == nil && v != SpecVersion {
		hint := ""
		if v < SpecVersion {
			hint = ": an encoding of an earlier spec version, whose keys this package does not compute; build the identity again"
		}
		d.fail("version %d, want %d%s", v, SpecVersion, hint)
	}
	if k := d.byte("kind"); d.err == nil && k != kindIdentity {
		d.fail("kind 0x%02x, want 0x%02x (identity)", k, kindIdentity)
	}
	var x Identity
	x.Tenant = d.str("Tenant", maxTenantLen)
	x.Model = d.str("Model", maxNameLen)
	x.WeightsVersion = d.str("WeightsVersion", maxNameLen)
	x.Generation = d.u64("Generation")
	x.Format.Device = d.str("Format.Device", maxDeviceLen)
	x.Format.ModelDType = DType(d.str("Format.ModelDType", maxDeviceLen))
	x.Format.KVDType = DType(d.str("Format.KVDType", maxDeviceLen))
	x.Format.KVQuant = d.str("Format.KVQuant", maxQuantLen)
	x.Format.MLADType = DType(d.str("Format.MLADType", maxDeviceLen))
	x.Layout.Layers = d.int("Layout.Layers")
	x.Layout.KVHeads = d.int("Layout.KVHeads")
	x.Layout.HeadDim = d.int("Layout.HeadDim")
	x.Layout.BlockSize = d.int("Layout.BlockSize")
	x.Layout.TPSize = d.int("Layout.TPSize")
	x.Layout.Replication = d.int("Layout.Replication")
	x.Layout.Groups = d.groups()
	if d.err == nil && len(x.Layout.Groups) > 0 && x.Layout.isDefaultGroups() {
		d.fail("Layout.Groups: one full-attention group of every layer at Layout.BlockSize is the default layout, encoded as 0 groups")
	}
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return d.err
	}
	if err := x.Validate(); err != nil {
		return err
	}
	*id = x
	return nil
}

// decoder reads the identity encoding, remembering the first error.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: at byte %d: %s", ErrMalformedIdentity, d.off, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) take(field string, n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.fail("%s: truncated: %d bytes left, want %d", field, len(d.b), n)
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	d.off += n
	return p
}

func (d *decoder) byte(field string) byte {
	if p := d.take(field, 1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u32(field string) uint32 {
	if p := d.take(field, 4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

// int reads a u32 layout value; values over 2^31-1 are errors here, so that
// decoding behaves the same with 32-bit ints.
func (d *decoder) int(field string) int {
	v := d.u32(field)
	if v > math.MaxInt32 {
		d.fail("%s: %d out of range", field, v)
		return 0
	}
	return int(v)
}

func (d *decoder) u64(field string) uint64 {
	if p := d.take(field, 8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (d *decoder) str(field string, max int) string {
	n := d.u32(field + " length")
	if d.err == nil && uint64(n) > uint64(max) {
		d.fail("%s: length %d over the limit of %d", field, n, max)
	}
	return string(d.take(field, int(n)))
}

// Namespace validates id and returns its namespace: the tenant and the
// BLAKE3 digest of id's canonical encoding ([Identity.MarshalBinary]).
// Equal identities give equal namespaces on every machine; identities that
// differ in any field give different ones.
func (id Identity) Namespace() (Namespace, error) {
	if err := id.Validate(); err != nil {
		return Namespace{}, err
	}
	var buf [256]byte
	digest := blake3.Sum256(id.appendEncoding(buf[:0]))
	return newNamespace(id.Tenant, digest, id.Layout), nil
}
