package p2p

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
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

// paramsVersion is the version of the Params encoding. Version 2: mailbox
// slots of 16 bytes, an offer word and a done word.
const paramsVersion = 2

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
	Mailbox uint64   `json:"mailbox"`
	Slots   int      `json:"slots"`
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
	case r.Mailbox+uint64(r.Slots)*slotBytes < r.Mailbox:
		return fmt.Errorf("mailbox = %#x: %d slots of %d bytes wrap around the address space", r.Mailbox, r.Slots, slotBytes)
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
	return kv.Validate()
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
