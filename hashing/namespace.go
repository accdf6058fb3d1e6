package hashing

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// IDLen is the number of hexadecimal digits of a namespace ID in keys: the
// first 16 bytes (128 bits) of the namespace digest. SPEC.md explains the
// choice.
const IDLen = 32

// MaxKeyLen is the longest key this package produces or parses, in bytes.
// Keys stay far below it (at most 168 bytes, 173 in a group's key, 13 more
// with a layer range); it equals the limit stores must accept.
const MaxKeyLen = 512

// maxLayerEnd is the largest end of a layer range in a key: the most
// layers a group can have (Layout.Layers is at most 65536).
const maxLayerEnd = maxLayoutValue

// maxShard is the largest shard index (TPSize is at most 65536).
const maxShard = maxLayoutValue - 1

// Namespace identifies one [Identity] in store keys: the tenant plus a
// digest of the identity's canonical encoding. It also knows the identity's
// block size, shard schema and KV cache groups. Get one from
// [Identity.Namespace]; the zero Namespace has no keys. Namespaces are
// comparable values, safe for concurrent use: equal identities give equal
// (==) namespaces.
type Namespace struct {
	tenant    string
	id        string // IDLen lowercase hex digits
	prefix    string // tenant "/" id "/"
	digest    [32]byte
	blockSize int
	tp, repl  int
	layers    int
	kinds     string // one GroupKind byte per group
	groups    string // the groups' part of the identity encoding; "" for the default layout
}

func newNamespace(tenant string, digest [32]byte, l Layout) Namespace {
	id := hex.EncodeToString(digest[:IDLen/2])
	ns := Namespace{
		tenant:    tenant,
		id:        id,
		prefix:    tenant + "/" + id + "/",
		digest:    digest,
		blockSize: l.BlockSize,
		tp:        l.TPSize,
		repl:      l.Replication,
		layers:    l.Layers,
		kinds:     string([]byte{byte(FullAttention)}),
	}
	if !l.isDefaultGroups() {
		ns.groups = string(appendGroups(nil, l))
		kinds := make([]byte, len(l.Groups))
		for i, g := range l.Groups {
			kinds[i] = byte(g.Kind)
		}
		ns.kinds = string(kinds)
	}
	return ns
}

// Tenant returns the namespace's tenant.
func (ns Namespace) Tenant() string { return ns.tenant }

// ID returns the namespace ID shown in keys: the first [IDLen] lowercase
// hexadecimal digits of the digest.
func (ns Namespace) ID() string { return ns.id }

// Digest returns the full BLAKE3 digest of the identity's encoding.
func (ns Namespace) Digest() [32]byte { return ns.digest }

// IsZero reports whether ns is the zero Namespace.
func (ns Namespace) IsZero() bool { return ns.tenant == "" }

// String returns "tenant/id", for logs.
func (ns Namespace) String() string { return ns.tenant + "/" + ns.id }

// BlockSize returns the block size in tokens of the chains whose hashes
// go into keys of ns: Layout.BlockSize, the hash block size (SPEC.md,
// "Block size of keys"). Build them with NewChain(ns.BlockSize(), ...).
// A group may have larger blocks, a multiple of it: see
// [Group.HashIndex]. A [BlockHash] does not record its block size, so
// [Namespace.Key] cannot check it.
func (ns Namespace) BlockSize() int { return ns.blockSize }

// Groups returns the identity's KV cache groups in their explicit form
// ([Layout.EffectiveGroups]): for a layout without groups, the one
// full-attention group of every layer. Group g of the result is group g
// of [Namespace.GroupKey]. The slice is a new copy, the caller's to
// modify; Groups of the zero Namespace is nil.
func (ns Namespace) Groups() []Group {
	switch {
	case ns.IsZero():
		return nil
	case ns.groups == "":
		return Layout{Layers: ns.layers, BlockSize: ns.blockSize}.EffectiveGroups()
	}
	d := decoder{b: []byte(ns.groups)}
	return d.groups()
}

// Prefix returns the prefix that every key of ns starts with, and no key of
// another namespace: "tenant/id/". Removing it from a store purges one
// identity (one generation of one model of one tenant). It is "" for the
// zero Namespace, and stores reject an empty prefix.
func (ns Namespace) Prefix() string { return ns.prefix }

// TenantPrefix returns the prefix that every key of tenant starts with, and
// no key of another tenant: "tenant/". Removing it from a store deletes the
// tenant's entries physically, once nothing reads them (a store with read
// leases leaves those still leased; see the package doc on rotation, which
// is what makes entries unreachable). It returns "" when tenant is not
// valid ([ValidateTenant]), which stores reject as a prefix, so that a bad
// tenant can never remove others' entries.
func TenantPrefix(tenant string) string {
	if ValidateTenant(tenant) != nil {
		return ""
	}
	return tenant + "/"
}

// TPSize returns the identity's tensor-parallel size.
func (ns Namespace) TPSize() int { return ns.tp }

// Replication returns how many TP ranks hold the same KV heads.
func (ns Namespace) Replication() int { return ns.repl }

// Shards returns the number of distinct KV shards of the attention
// groups: TPSize / Replication. A block is stored once per shard, and a
// block is present for a request only when it is present for every shard.
// A RecurrentState group has a shard per TP rank instead: see
// [Namespace.GroupShards].
func (ns Namespace) Shards() int {
	if ns.repl == 0 {
		return 0
	}
	return ns.tp / ns.repl
}

// Shard returns the shard that TP rank rank holds of the attention groups:
// rank / Replication. Ranks that hold the same KV heads (Replication
// consecutive ranks) have the same shard and so the same keys, which store
// a block once: exactly one of them must save each block (the reference
// connector gives block i to the rank with rank % Replication == i %
// Replication, spreading the writes), and any of them may load it. Shard
// panics unless 0 <= rank < TPSize. For the shard of a RecurrentState
// group, use [Namespace.GroupShard].
func (ns Namespace) Shard(rank int) int {
	if rank < 0 || rank >= ns.tp {
		panic(fmt.Sprintf("hashing: Namespace.Shard: rank %d outside [0, %d)", rank, ns.tp))
	}
	return rank / ns.repl
}

// GroupShards returns the number of distinct shards of group group: for
// full-attention and sliding-window groups [Namespace.Shards]; for a
// RecurrentState group TPSize, since each rank holds its own part of the
// state (its share of the heads), even where the ranks replicate KV heads.
// It panics unless 0 <= group < len(ns.Groups()).
func (ns Namespace) GroupShards(group int) int {
	if group < 0 || group >= len(ns.kinds) {
		panic(fmt.Sprintf("hashing: Namespace.GroupShards: group %d outside [0, %d)", group, len(ns.kinds)))
	}
	return ns.groupShards(group)
}

func (ns Namespace) groupShards(group int) int {
	if GroupKind(ns.kinds[group]) == RecurrentState {
		return ns.tp
	}
	return ns.Shards()
}

// GroupShard returns the shard of group group that TP rank rank holds:
// [Namespace.Shard] for full-attention and sliding-window groups, the rank
// itself for a RecurrentState group, whose every rank saves its own part.
// It panics unless 0 <= group < len(ns.Groups()) and 0 <= rank < TPSize.
func (ns Namespace) GroupShard(group, rank int) int {
	if group < 0 || group >= len(ns.kinds) {
		panic(fmt.Sprintf("hashing: Namespace.GroupShard: group %d outside [0, %d)", group, len(ns.kinds)))
	}
	if rank < 0 || rank >= ns.tp {
		panic(fmt.Sprintf("hashing: Namespace.GroupShard: rank %d outside [0, %d)", rank, ns.tp))
	}
	if GroupKind(ns.kinds[group]) == RecurrentState {
		return rank
	}
	return rank / ns.repl
}

// Key returns the store key of block h in shard shard of ns:
// "tenant/id/shard/hash", with the shard in decimal and the hash in 64
// lowercase hexadecimal digits. It is the key of group 0,
// ns.GroupKey(0, shard, h): the only group of a layout without groups. h
// must come from a [Chain] of ns.BlockSize() tokens per block; Key cannot
// tell, so a hash of another block size gives a key that no correct
// reader asks for. Key panics unless 0 <= shard < ns.GroupShards(0) (which
// is ns.Shards() unless group 0 is a RecurrentState group); map a TP rank
// to its shard with [Namespace.Shard] or [Namespace.GroupShard].
func (ns Namespace) Key(shard int, h BlockHash) string {
	var buf [MaxKeyLen]byte
	return string(ns.AppendKey(buf[:0], shard, h))
}

// AppendKey appends the key that [Namespace.Key] returns to dst and returns
// the extended slice; it does not allocate when dst has room.
func (ns Namespace) AppendKey(dst []byte, shard int, h BlockHash) []byte {
	if n := ns.keyShards(); shard < 0 || shard >= n {
		panic(fmt.Sprintf("hashing: Namespace.Key: shard %d outside [0, %d)", shard, n))
	}
	return ns.appendKey(dst, 0, shard, h)
}

// keyShards is the number of shards of group 0, 0 for the zero Namespace.
func (ns Namespace) keyShards() int {
	if len(ns.kinds) == 0 {
		return 0
	}
	return ns.groupShards(0)
}

// GroupKey returns the store key of block h in shard shard of group group
// of ns. For group 0 it is [Namespace.Key]'s "tenant/id/shard/hash"; for
// group g >= 1 it is "tenant/id/shard/g<g>/hash", with g in decimal: each
// group has its own keys, distinct from every other group's. h is the
// chain hash that names the group's block ([Group.HashIndex]): for block j
// of a group of BlockSize k×ns.BlockSize(), the hash at index (j+1)×k−1.
// GroupKey panics unless 0 <= group < len(ns.Groups()) and 0 <= shard <
// ns.GroupShards(group); map a TP rank to its shard with
// [Namespace.GroupShard].
func (ns Namespace) GroupKey(group, shard int, h BlockHash) string {
	var buf [MaxKeyLen]byte
	return string(ns.AppendGroupKey(buf[:0], group, shard, h))
}

// AppendGroupKey appends the key that [Namespace.GroupKey] returns to dst
// and returns the extended slice; it does not allocate when dst has room.
func (ns Namespace) AppendGroupKey(dst []byte, group, shard int, h BlockHash) []byte {
	if group < 0 || group >= len(ns.kinds) {
		panic(fmt.Sprintf("hashing: Namespace.GroupKey: group %d outside [0, %d)", group, len(ns.kinds)))
	}
	if n := ns.groupShards(group); shard < 0 || shard >= n {
		panic(fmt.Sprintf("hashing: Namespace.GroupKey: shard %d outside [0, %d) of group %d", shard, n, group))
	}
	return ns.appendKey(dst, group, shard, h)
}

// LayerRange is a half-open range [Lo, Hi) of the layers of one KV cache
// group: positions in the order of the group's [Group.Layers], 0 to
// len(Layers)-1, not the model's layer indices. The zero LayerRange (Hi ==
// 0) stands for the whole block, every layer of the group.
type LayerRange struct {
	Lo, Hi int
}

// LayerKey returns the store key of layers [lo, hi) of block h in shard
// shard of group group of ns: the key [Namespace.GroupKey] returns, then
// "/l<lo>-<hi>", with lo and hi in decimal. lo and hi are positions in the
// group's layers (ns.Groups()[group].Layers), so 0 <= lo < hi <= n, n the
// group's number of layers. The value under the key holds those layers'
// bytes in the order of the block's whole value (layer by layer, K before
// V): a contiguous slice of it. So a connector may store a block as
// several values, each of a range of its layers, and load or save them
// one by one; ranges of two splits that coincide have the same key, since
// they name the same bytes. For the whole group, lo == 0 and hi == n, the
// value is the block's own, and LayerKey returns exactly GroupKey(group,
// shard, h): there is one key per block and layer range, and a key with
// a layer field never covers the whole group. LayerKey panics unless 0 <=
// group < len(ns.Groups()), 0 <= shard < ns.GroupShards(group) and 0 <=
// lo < hi <= n.
func (ns Namespace) LayerKey(group, shard int, h BlockHash, lo, hi int) string {
	var buf [MaxKeyLen]byte
	return string(ns.AppendLayerKey(buf[:0], group, shard, h, lo, hi))
}

// AppendLayerKey appends the key that [Namespace.LayerKey] returns to dst
// and returns the extended slice; it does not allocate when dst has room.
func (ns Namespace) AppendLayerKey(dst []byte, group, shard int, h BlockHash, lo, hi int) []byte {
	if group < 0 || group >= len(ns.kinds) {
		panic(fmt.Sprintf("hashing: Namespace.LayerKey: group %d outside [0, %d)", group, len(ns.kinds)))
	}
	if n := ns.groupShards(group); shard < 0 || shard >= n {
		panic(fmt.Sprintf("hashing: Namespace.LayerKey: shard %d outside [0, %d) of group %d", shard, n, group))
	}
	n := ns.groupLayers(group)
	if lo < 0 || lo >= hi || hi > n {
		panic(fmt.Sprintf("hashing: Namespace.LayerKey: layers [%d, %d) of group %d, want 0 <= lo < hi <= %d (its layers)", lo, hi, group, n))
	}
	dst = ns.appendKey(dst, group, shard, h)
	if lo == 0 && hi == n {
		return dst
	}
	return appendLayers(dst, LayerRange{lo, hi})
}

func appendLayers(dst []byte, r LayerRange) []byte {
	dst = append(dst, "/l"...)
	dst = strconv.AppendInt(dst, int64(r.Lo), 10)
	dst = append(dst, '-')
	return strconv.AppendInt(dst, int64(r.Hi), 10)
}

// groupLayers returns the number of layers of group group, read from the
// groups' encoding without decoding it.
func (ns Namespace) groupLayers(group int) int {
	if ns.groups == "" {
		return ns.layers
	}
	u32 := func(i int) int {
		return int(uint32(ns.groups[i]) | uint32(ns.groups[i+1])<<8 | uint32(ns.groups[i+2])<<16 | uint32(ns.groups[i+3])<<24)
	}
	// After the count, each group is kind (1 byte), block size, window
	// and state bytes (4 each), the number of layers (4), then its layers.
	off := 4
	for range group {
		off += 17 + 4*u32(off+13)
	}
	return u32(off + 13)
}

func (ns Namespace) appendKey(dst []byte, group, shard int, h BlockHash) []byte {
	dst = append(dst, ns.prefix...)
	dst = strconv.AppendUint(dst, uint64(shard), 10)
	dst = append(dst, '/')
	if group > 0 {
		dst = append(dst, 'g')
		dst = strconv.AppendUint(dst, uint64(group), 10)
		dst = append(dst, '/')
	}
	return hex.AppendEncode(dst, h[:])
}

// Key is a parsed store key.
type Key struct {
	Tenant    string     // the tenant
	Namespace string     // the namespace ID: IDLen lowercase hex digits
	Rank      int        // the shard index (see Namespace.GroupShard); the TP rank when Replication is 1
	Group     int        // the KV cache group: 0, or 1 to MaxGroups-1 (see Namespace.GroupKey)
	Hash      BlockHash  // the block hash
	Layers    LayerRange // the layers of a layer range's key (see Namespace.LayerKey); zero for a whole block's
}

// String formats k as a key: "tenant/namespace/rank/hash" for group 0,
// "tenant/namespace/rank/g<group>/hash" for another group, followed by
// "/l<lo>-<hi>" when k.Layers is not zero. For a k that [ParseKey]
// returned it gives back the parsed string.
func (k Key) String() string {
	var b strings.Builder
	b.Grow(len(k.Tenant) + len(k.Namespace) + 96)
	b.WriteString(k.Tenant)
	b.WriteByte('/')
	b.WriteString(k.Namespace)
	b.WriteByte('/')
	b.WriteString(strconv.Itoa(k.Rank))
	b.WriteByte('/')
	if k.Group != 0 {
		b.WriteByte('g')
		b.WriteString(strconv.Itoa(k.Group))
		b.WriteByte('/')
	}
	b.WriteString(k.Hash.String())
	if k.Layers != (LayerRange{}) {
		var buf [32]byte
		b.Write(appendLayers(buf[:0], k.Layers))
	}
	return b.String()
}

// ParseKey parses a key of the form [Namespace.Key], [Namespace.GroupKey]
// or [Namespace.LayerKey] returns. It never panics; a malformed key gives
// an error that wraps [ErrMalformedKey] and says which part is wrong. Only
// the canonical form is accepted (lowercase hex, no leading zeros or sign
// in the shard, the group or the layer numbers, no group field for group
// 0, a layer field only last, with 0 <= lo < hi <= 65536), so
// ParseKey(s).String() == s whenever ParseKey succeeds. A key's layer
// range is set in Key.Layers, which is zero for a whole block's key.
// ParseKey does not know the identity, so it cannot reject a layer range
// that covers its whole group (or reaches past its layers): LayerKey never
// produces one, giving the block's key instead.
func ParseKey(s string) (Key, error) {
	bad := func(format string, args ...any) (Key, error) {
		return Key{}, fmt.Errorf("%w: %s: %s", ErrMalformedKey, quoteTrunc(s), fmt.Sprintf(format, args...))
	}
	if len(s) > MaxKeyLen {
		return bad("%d bytes, longer than %d", len(s), MaxKeyLen)
	}
	// A layer field is the last and starts with 'l', which no hash does
	// (nor with 'L', which gets its own error).
	block, layers, layered := s, "", false
	if i := strings.LastIndexByte(s, '/'); i >= 0 && i+1 < len(s) && (s[i+1] == 'l' || s[i+1] == 'L') {
		block, layers, layered = s[:i], s[i+1:], true
	}
	tenant, rest, ok1 := strings.Cut(block, "/")
	id, rest, ok2 := strings.Cut(rest, "/")
	shard, rest, ok3 := strings.Cut(rest, "/")
	group, hash, grouped := strings.Cut(rest, "/")
	if !grouped {
		group, hash = "", rest
	}
	if !ok1 || !ok2 || !ok3 || strings.Contains(hash, "/") {
		return bad("want 4 fields separated by '/' (tenant/namespace/shard/hash), or 5 in a group's key (tenant/namespace/shard/g<group>/hash), and one more in a layer range's key (.../hash/l<lo>-<hi>), have %d", strings.Count(s, "/")+1)
	}
	if err := ValidateTenant(tenant); err != nil {
		return bad("tenant: %v", err.(*FieldError).Reason)
	}
	var idb [IDLen / 2]byte
	if err := parseHex(idb[:], id); err != nil {
		return bad("namespace %s: %v", quoteTrunc(id), err)
	}
	r, err := parseShard(shard)
	if err != nil {
		return bad("shard %s: %v", quoteTrunc(shard), err)
	}
	g := 0
	if grouped {
		if g, err = parseGroup(group); err != nil {
			return bad("group %s: %v", quoteTrunc(group), err)
		}
	}
	var h BlockHash
	if err := parseHex(h[:], hash); err != nil {
		return bad("hash: %v", err)
	}
	var lr LayerRange
	if layered {
		if lr, err = parseLayers(layers); err != nil {
			return bad("layers %s: %v", quoteTrunc(layers), err)
		}
	}
	return Key{Tenant: tenant, Namespace: id, Rank: r, Group: g, Hash: h, Layers: lr}, nil
}

// parseLayers parses the layer field of a layer range's key: 'l', then lo
// "-" hi in canonical decimal, 0 <= lo < hi <= maxLayerEnd.
func parseLayers(s string) (LayerRange, error) {
	digits, ok := strings.CutPrefix(s, "l")
	if !ok {
		return LayerRange{}, fmt.Errorf("want 'l' and the layer range <lo>-<hi>")
	}
	los, his, ok := strings.Cut(digits, "-")
	if !ok {
		return LayerRange{}, fmt.Errorf("want <lo>-<hi> after 'l'")
	}
	lo, err := parseDecimal(los, maxLayerEnd-1, "first layer")
	if err != nil {
		return LayerRange{}, fmt.Errorf("first layer %s: %v", quoteTrunc(los), err)
	}
	hi, err := parseDecimal(his, maxLayerEnd, "layer range end")
	if err != nil {
		return LayerRange{}, fmt.Errorf("end %s: %v", quoteTrunc(his), err)
	}
	if lo >= hi {
		return LayerRange{}, fmt.Errorf("empty range: the first layer %d is not below the end %d", lo, hi)
	}
	return LayerRange{Lo: lo, Hi: hi}, nil
}

// parseGroup parses the group field of a group's key: 'g' and a canonical
// decimal from 1 to MaxGroups-1.
func parseGroup(s string) (int, error) {
	digits, ok := strings.CutPrefix(s, "g")
	if !ok {
		return 0, fmt.Errorf("want 'g' and the group number")
	}
	switch {
	case digits == "":
		return 0, fmt.Errorf("no group number after 'g'")
	case len(digits) > 1 && digits[0] == '0':
		return 0, fmt.Errorf("leading zero")
	case digits == "0":
		return 0, fmt.Errorf("group 0 has no group field: its keys are tenant/namespace/shard/hash")
	}
	n := 0
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("character %q at %d is not a decimal digit", c, i+1)
		}
		n = n*10 + int(c-'0')
		if n >= MaxGroups {
			return 0, fmt.Errorf("above the largest group %d", MaxGroups-1)
		}
	}
	return n, nil
}

// parseShard parses a canonical decimal shard index.
func parseShard(s string) (int, error) { return parseDecimal(s, maxShard, "shard") }

// parseDecimal parses a canonical decimal from 0 to max, the largest
// value of what.
func parseDecimal(s string, max int, what string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("empty")
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("leading zero")
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("character %q at %d is not a decimal digit", c, i)
		}
		n = n*10 + int(c-'0')
		if n > max {
			return 0, fmt.Errorf("above the largest %s %d", what, max)
		}
	}
	return n, nil
}
