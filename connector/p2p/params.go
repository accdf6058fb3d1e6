package p2p

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/zeebo/blake3"
)

// Errors of the package.
var (
	// ErrParams: transfer parameters that do not decode or do not fit
	// this connector (block size, ranks, layout).
	ErrParams = errors.New("p2p: invalid transfer parameters")
	// ErrIdentity: transfer parameters from a producer whose namespace
	// (tenant, model, weights, generation, KV format or layout) differs
	// from the consumer's: its KV would be wrong here.
	ErrIdentity = errors.New("p2p: transfer parameters of another identity")
	// ErrNoHandshake: the scheduler half has not yet learnt every
	// worker's memory (the workers' Register, or SetHandshake).
	ErrNoHandshake = errors.New("p2p: workers not registered")
)

// paramsVersion is the version of the Params encoding. Version 3: a
// mailbox header that names its worker, slots of 64 bytes that carry the
// offer's seal, and a ticket per offer for the done notice.
const paramsVersion = 3

// Params are the transfer parameters a producer returns when a request
// ends, for the consumer that continues it: where the request's blocks are
// and how to tell the producer it is done with them. They play the part of
// vLLM's kv_transfer_params; [EncodeParams] gives their JSON form.
type Params struct {
	Version int `json:"v"`
	// Namespace is the producer's namespace (hashing.Namespace.String):
	// a consumer of another namespace refuses the parameters.
	Namespace string `json:"namespace"`
	// Engine is the producer's engine id (kv_transfer_config engine_id),
	// for logs.
	Engine string `json:"engine,omitempty"`
	// Offer identifies the offer (its sequence number, unique among the
	// producer's offers and growing); the consumer writes it into the
	// done word of the producer's mailbox slot Slot when it is done.
	Offer uint64 `json:"offer"`
	Slot  int    `json:"slot"`
	// Ticket is the offer's secret for its done notice: 16 hex digits of
	// a random 64-bit number, not 0, that the producer takes for done
	// only from the slot's done word. Whoever holds the parameters can
	// end the offer early; nobody else can.
	Ticket string `json:"ticket"`
	// BlockSize is the number of tokens per block.
	BlockSize int `json:"block_size"`
	// Blocks are the producer's blocks holding the request's first
	// len(Blocks) blocks of tokens, whose hashes are Hashes.
	Blocks []connector.BlockID `json:"blocks"`
	Hashes []hashing.BlockHash `json:"hashes"`
	// Ranks describe each tensor-parallel rank's memory, in rank order.
	Ranks []Rank `json:"ranks"`
}

// Rank is one producer worker's memory: its transfer engine segment, the
// base address of each KV region in the producer's process, its KV
// layout, its mailbox, and its digest table. It is what the worker's
// Handshake returns.
type Rank struct {
	Segment string   `json:"segment"`
	Regions []uint64 `json:"regions"`
	// Mailbox is the address of the worker's mailbox: a header of 64
	// bytes that proves it is this worker's (see the package
	// documentation, "The mailbox"), then Slots slots of 64 bytes.
	Mailbox uint64 `json:"mailbox"`
	Slots   int    `json:"slots"`
	// Nonce is 32 hex digits, random for each Register: it makes the
	// mailbox header of every worker instance one nobody can predict.
	Nonce string `json:"nonce"`
	// Digests is the address of the producer's digest table, 0 for none
	// (KV in device memory): Blocks little-endian CRC-32s (IEEE), the
	// one of block b at Digests+4b, valid while an armed offer holds b.
	Digests    uint64 `json:"digests,omitempty"`
	Layers     int    `json:"layers"`
	Blocks     int    `json:"blocks"`
	KV         int    `json:"kv"`
	BlockBytes int    `json:"block_bytes"`
	Order      string `json:"order"`
}

// EncodeParams returns the JSON form of p.
func EncodeParams(p Params) ([]byte, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	return json.Marshal(p)
}

// DecodeParams decodes and checks parameters from EncodeParams. It never
// panics; every error wraps [ErrParams] and names the field.
func DecodeParams(data []byte) (Params, error) {
	var p Params
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Params{}, fmt.Errorf("%w: %v", ErrParams, err)
	}
	if dec.More() {
		return Params{}, fmt.Errorf("%w: trailing data after the JSON object", ErrParams)
	}
	if err := p.validate(); err != nil {
		return Params{}, err
	}
	return p, nil
}

func (p Params) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrParams, fmt.Sprintf(format, args...))
	}
	switch {
	case p.Version != paramsVersion:
		return bad("v = %d, want %d", p.Version, paramsVersion)
	case p.Namespace == "":
		return bad("namespace is empty")
	case p.Offer == 0 || p.Offer >= 1<<62:
		return bad("offer = %d, want 1 to 2^62-1", p.Offer)
	case p.BlockSize <= 0:
		return bad("block_size = %d, want > 0", p.BlockSize)
	case len(p.Blocks) == 0:
		return bad("blocks is empty")
	case len(p.Hashes) != len(p.Blocks):
		return bad("%d hashes for %d blocks", len(p.Hashes), len(p.Blocks))
	case len(p.Ranks) == 0:
		return bad("ranks is empty")
	}
	if t, err := parseTicket(p.Ticket); err != nil || t == 0 {
		return bad("ticket = %q, want 16 hex digits, not all 0", p.Ticket)
	}
	for i, r := range p.Ranks {
		if err := r.validate(); err != nil {
			return fmt.Errorf("%w: ranks[%d]: %w", ErrParams, i, err)
		}
		if p.Slot < 0 || p.Slot >= r.Slots {
			return bad("slot = %d, rank %d has %d slots", p.Slot, i, r.Slots)
		}
		if want := int(p.Offer % uint64(r.Slots)); p.Slot != want {
			return bad("slot = %d, but offer %d of rank %d's %d slots uses slot %d", p.Slot, p.Offer, i, r.Slots, want)
		}
		for j, b := range p.Blocks {
			if b < 0 || int(b) >= r.Blocks {
				return bad("blocks[%d] = %d, rank %d has %d blocks", j, b, i, r.Blocks)
			}
		}
	}
	return nil
}

func (r Rank) validate() error {
	switch {
	case r.Segment == "":
		return errors.New("segment is empty")
	case r.Mailbox == 0 || r.Mailbox%8 != 0:
		return fmt.Errorf("mailbox = %#x, want a non-zero 8-aligned address", r.Mailbox)
	case r.Slots <= 0 || r.Slots > maxSlots:
		return fmt.Errorf("slots = %d, want 1 to %d", r.Slots, maxSlots)
	case r.Mailbox+headerBytes+uint64(r.Slots)*slotBytes < r.Mailbox:
		return fmt.Errorf("mailbox = %#x: a header and %d slots of %d bytes wrap around the address space", r.Mailbox, r.Slots, slotBytes)
	case r.Order != connector.BlockMajor.String() && r.Order != connector.LayerMajor.String():
		return fmt.Errorf("order = %q, want %q or %q", r.Order, connector.BlockMajor, connector.LayerMajor)
	}
	kv, err := r.cache()
	if err != nil {
		return err
	}
	if r.Digests != 0 && r.Digests+uint64(r.Blocks)*4 < r.Digests {
		return fmt.Errorf("digests = %#x: %d digests of 4 bytes wrap around the address space", r.Digests, r.Blocks)
	}
	if err := kv.Validate(); err != nil {
		return err
	}
	if len(r.Nonce) != 32 || !isHex(r.Nonce) {
		return fmt.Errorf("nonce = %q, want 32 hex digits", r.Nonce)
	}
	return nil
}

// cache returns the producer's KV layout as a KVCache whose regions have
// the producer's addresses (meaningful only in the producer's process).
func (r Rank) cache() (connector.KVCache, error) {
	kv := connector.KVCache{Layers: r.Layers, Blocks: r.Blocks, KV: r.KV, BlockBytes: r.BlockBytes, Order: connector.BlockMajor}
	if r.Order == connector.LayerMajor.String() {
		kv.Order = connector.LayerMajor
	}
	if len(r.Regions) == 0 {
		return kv, fmt.Errorf("regions is empty")
	}
	total, err := layoutBytes(rankFields, r.Layers, r.KV, r.Blocks, r.BlockBytes)
	if err != nil {
		return kv, err
	}
	per := total / uint64(len(r.Regions))
	if per > math.MaxInt {
		return kv, fmt.Errorf("regions of %d bytes do not fit an int", per)
	}
	for i, a := range r.Regions {
		if a == 0 || a+per < a || uint64(uintptr(a)) != a {
			return kv, fmt.Errorf("regions[%d] = %#x: %d bytes there are not addresses", i, a, per)
		}
		kv.Regions = append(kv.Regions, regionAt(uintptr(a), int(per)))
	}
	return kv, nil
}

// maxSlots is the most mailbox slots a producer worker has.
const maxSlots = 1 << 20

// maxLayout is the most bytes a KV layout may span.
const maxLayout = 1 << 50

// The names of the four factors of a layout's size, for errors.
var (
	rankFields    = [4]string{"layers", "kv", "blocks", "block_bytes"}
	kvCacheFields = [4]string{"KVCache.Layers", "KVCache.KV", "KVCache.Blocks", "KVCache.BlockBytes"}
)

// layoutBytes returns layers × kv × blocks × blockBytes, the bytes of a KV
// layout, multiplied factor by factor without overflow. A factor that is
// not positive is an error naming it (from names) and its value; a product
// past maxLayout, one naming every factor and its value.
func layoutBytes(names [4]string, layers, kv, blocks, blockBytes int) (uint64, error) {
	factors := [4]int{layers, kv, blocks, blockBytes}
	total := uint64(1)
	for i, v := range factors {
		if v <= 0 {
			return 0, fmt.Errorf("%s = %d, want > 0", names[i], v)
		}
		hi, lo := bits.Mul64(total, uint64(v))
		if hi != 0 || lo > maxLayout {
			return 0, fmt.Errorf("layout of %s = %d × %s = %d × %s = %d × %s = %d bytes: more than 2^50 bytes",
				names[0], layers, names[1], kv, names[2], blocks, names[3], blockBytes)
		}
		total = lo
	}
	return total, nil
}

// encodeRank returns the JSON form of a worker's memory.
func encodeRank(r Rank) ([]byte, error) {
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrParams, err)
	}
	return json.Marshal(r)
}

// decodeRank decodes a worker's memory from its Handshake.
func decodeRank(data []byte) (Rank, error) {
	var r Rank
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Rank{}, fmt.Errorf("%w: handshake: %v", ErrParams, err)
	}
	if dec.More() {
		return Rank{}, fmt.Errorf("%w: handshake: trailing data", ErrParams)
	}
	if err := r.validate(); err != nil {
		return Rank{}, fmt.Errorf("%w: handshake: %w", ErrParams, err)
	}
	return r, nil
}

// parseTicket decodes a ticket's 16 hex digits.
func parseTicket(s string) (uint64, error) {
	var b [8]byte
	if len(s) != 16 {
		return 0, fmt.Errorf("%d characters", len(s))
	}
	if _, err := hex.Decode(b[:], []byte(s)); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b[:]), nil
}

// newTicket returns a random ticket, not 0, and its text.
func newTicket() (uint64, string) {
	var b [8]byte
	for {
		rand.Read(b[:])
		if t := binary.BigEndian.Uint64(b[:]); t != 0 {
			return t, hex.EncodeToString(b[:])
		}
	}
}

// newNonce returns a random mailbox nonce.
func newNonce() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// A seal is the BLAKE3-256 of a canonical encoding of what it seals:
// every field, in order, integers as 8 bytes little-endian, strings and
// lists after their length.
type seal [32]byte

// sealer builds the canonical encoding of a seal.
type sealer struct{ b []byte }

func (s *sealer) u64(v uint64) { s.b = binary.LittleEndian.AppendUint64(s.b, v) }
func (s *sealer) str(v string) { s.u64(uint64(len(v))); s.b = append(s.b, v...) }
func (s *sealer) sum() seal    { return blake3.Sum256(s.b) }

func (s *sealer) rank(r *Rank) {
	s.str(r.Segment)
	s.u64(uint64(len(r.Regions)))
	for _, a := range r.Regions {
		s.u64(a)
	}
	s.u64(r.Mailbox)
	s.u64(uint64(r.Slots))
	s.str(strings.ToLower(r.Nonce))
	s.u64(r.Digests)
	s.u64(uint64(r.Layers))
	s.u64(uint64(r.Blocks))
	s.u64(uint64(r.KV))
	s.u64(uint64(r.BlockBytes))
	s.str(r.Order)
}

// mailboxSeal is what the mailbox header of the worker r describes
// carries: it proves to a consumer that the memory at r.Mailbox is that
// worker's mailbox, before the consumer writes into it.
func mailboxSeal(r *Rank) seal {
	s := sealer{b: []byte("kvconnect p2p mailbox v3\x00")}
	s.rank(r)
	return s.sum()
}

// offerSeal is what the slot of offer p carries once it is armed: it
// proves to a consumer that the producer made the offer with exactly these
// parameters (these blocks, this digest table, this ticket).
func offerSeal(p *Params) seal {
	s := sealer{b: []byte("kvconnect p2p offer v3\x00")}
	s.u64(uint64(p.Version))
	s.str(p.Namespace)
	s.str(p.Engine)
	s.u64(p.Offer)
	s.u64(uint64(p.Slot))
	s.str(strings.ToLower(p.Ticket))
	s.u64(uint64(p.BlockSize))
	s.u64(uint64(len(p.Blocks)))
	for _, b := range p.Blocks {
		s.u64(uint64(b))
	}
	for _, h := range p.Hashes {
		s.b = append(s.b, h[:]...)
	}
	s.u64(uint64(len(p.Ranks)))
	for i := range p.Ranks {
		s.rank(&p.Ranks[i])
	}
	return s.sum()
}
