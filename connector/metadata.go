package connector

import (
	"encoding/binary"
	"fmt"

	"github.com/kvconnect/kvconnect/hashing"
)

// Metadata is one step's plan for the workers: the loads to start and the
// saves to make once the step's compute is ready. The scheduler half builds
// it; the engine ships it to every worker, in memory or encoded with
// MarshalBinary when workers are other processes.
type Metadata struct {
	Step       uint64     // the step number, increasing
	Generation uint64     // the weights generation every key of this step is bound to
	Loads      []Transfer // blocks to load from the store
	Saves      []Transfer // blocks to save to the store
}

// Transfer is a run of one request's blocks to load or save.
type Transfer struct {
	ID     uint64              // unique among the connector's transfers
	Req    RequestID           // the request the blocks belong to
	First  int                 // index in the request's chain of Blocks[0]
	Blocks []BlockID           // engine blocks, the same in every worker
	Hashes []hashing.BlockHash // Hashes[i] is the hash of Blocks[i]'s tokens
}

// Reason says why a block's transfer failed.
type Reason uint8

const (
	ReasonIO       Reason = iota + 1 // the store or transport failed
	ReasonNotFound                   // the block was not in the store (evicted, say)
	ReasonNoSpace                    // the store had no room; a save may be retried
	ReasonStale                      // dropped: its generation was rotated out
	ReasonCanceled                   // dropped: the worker closed
	ReasonCorrupt                    // the bytes read failed verification: not what was saved under the key
)

func (r Reason) String() string {
	switch r {
	case ReasonIO:
		return "io"
	case ReasonNotFound:
		return "not-found"
	case ReasonNoSpace:
		return "no-space"
	case ReasonStale:
		return "stale"
	case ReasonCanceled:
		return "canceled"
	case ReasonCorrupt:
		return "corrupt"
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Output is what one worker reports after a step: the transfers that
// finished since its last report, and the blocks among them that failed.
type Output struct {
	Rank   int       // the reporting worker's rank
	Done   []uint64  // IDs of transfers that finished in this worker, with or without failures
	Failed []Failure // blocks of those transfers that failed
}

// Failure is one block of a transfer that failed in a worker.
type Failure struct {
	Transfer uint64 // the transfer's ID
	Index    int    // index into the transfer's Blocks
	Reason   Reason
}

// Reset empties o, keeping its capacity.
func (o *Output) Reset() {
	o.Done = o.Done[:0]
	o.Failed = o.Failed[:0]
}

// Reset empties m, keeping its capacity.
func (m *Metadata) Reset() {
	m.Loads = m.Loads[:0]
	m.Saves = m.Saves[:0]
}

// Wire format, version 1. Integers are unsigned varints (signed ones
// zig-zag), strings and lists are length-prefixed, hashes are 32 raw bytes.
//
//	metadata = "KVM" 0x01 step generation nloads transfer* nsaves transfer*
//	transfer = id req first nblocks block* hash*
//	output   = "KVO" 0x01 rank ndone id* nfailed (transfer index reason)*
const wireVersion = 1

var (
	metaMagic = [3]byte{'K', 'V', 'M'}
	outMagic  = [3]byte{'K', 'V', 'O'}
)

// MarshalBinary encodes m in the versioned wire format.
func (m *Metadata) MarshalBinary() ([]byte, error) { return m.AppendBinary(nil) }

// AppendBinary appends the encoding of m to b.
func (m *Metadata) AppendBinary(b []byte) ([]byte, error) {
	b = append(b, metaMagic[:]...)
	b = append(b, wireVersion)
	b = binary.AppendUvarint(b, m.Step)
	b = binary.AppendUvarint(b, m.Generation)
	for _, list := range [2][]Transfer{m.Loads, m.Saves} {
		b = binary.AppendUvarint(b, uint64(len(list)))
		for i := range list {
			t := &list[i]
			if len(t.Hashes) != len(t.Blocks) {
				return nil, fmt.Errorf("%w: transfer %d has %d blocks but %d hashes", ErrBadMetadata, t.ID, len(t.Blocks), len(t.Hashes))
			}
			b = binary.AppendUvarint(b, t.ID)
			b = binary.AppendUvarint(b, uint64(len(t.Req)))
			b = append(b, t.Req...)
			b = binary.AppendVarint(b, int64(t.First))
			b = binary.AppendUvarint(b, uint64(len(t.Blocks)))
			for _, id := range t.Blocks {
				b = binary.AppendVarint(b, int64(id))
			}
			for _, h := range t.Hashes {
				b = append(b, h[:]...)
			}
		}
	}
	return b, nil
}

// UnmarshalBinary decodes data into m, replacing its contents. It never
// panics and never allocates more than the input can describe.
func (m *Metadata) UnmarshalBinary(data []byte) error {
	d := decoder{b: data}
	d.magic(metaMagic)
	m.Step = d.uvarint()
	m.Generation = d.uvarint()
	m.Loads = d.transfers(m.Loads[:0])
	m.Saves = d.transfers(m.Saves[:0])
	return d.finish("metadata")
}

// MarshalBinary encodes o in the versioned wire format.
func (o *Output) MarshalBinary() ([]byte, error) { return o.AppendBinary(nil) }

// AppendBinary appends the encoding of o to b.
func (o *Output) AppendBinary(b []byte) ([]byte, error) {
	b = append(b, outMagic[:]...)
	b = append(b, wireVersion)
	b = binary.AppendVarint(b, int64(o.Rank))
	b = binary.AppendUvarint(b, uint64(len(o.Done)))
	for _, id := range o.Done {
		b = binary.AppendUvarint(b, id)
	}
	b = binary.AppendUvarint(b, uint64(len(o.Failed)))
	for _, f := range o.Failed {
		b = binary.AppendUvarint(b, f.Transfer)
		b = binary.AppendVarint(b, int64(f.Index))
		b = append(b, byte(f.Reason))
	}
	return b, nil
}

// UnmarshalBinary decodes data into o, replacing its contents. It never
// panics and never allocates more than the input can describe.
func (o *Output) UnmarshalBinary(data []byte) error {
	d := decoder{b: data}
	d.magic(outMagic)
	o.Rank = d.int()
	n := d.count(1)
	o.Done = o.Done[:0]
	for i := 0; i < n && d.err == nil; i++ {
		o.Done = append(o.Done, d.uvarint())
	}
	n = d.count(3)
	o.Failed = o.Failed[:0]
	for i := 0; i < n && d.err == nil; i++ {
		f := Failure{Transfer: d.uvarint(), Index: d.int()}
		f.Reason = Reason(d.byte())
		o.Failed = append(o.Failed, f)
	}
	return d.finish("output")
}

type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: at byte %d: %s", ErrBadMetadata, d.off, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) magic(want [3]byte) {
	if len(d.b) < 4 || [3]byte(d.b[:3]) != want {
		d.fail("bad magic, want %q", want[:])
		return
	}
	if d.b[3] != wireVersion {
		d.fail("wire version %d, want %d", d.b[3], wireVersion)
		return
	}
	d.off = 4
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) int() int {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b[d.off:])
	if n <= 0 || v != int64(int(v)) || v < -1<<31 || v > 1<<31-1 {
		d.fail("bad signed varint")
		return 0
	}
	d.off += n
	return int(v)
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if d.off >= len(d.b) {
		d.fail("truncated")
		return 0
	}
	c := d.b[d.off]
	d.off++
	return c
}

// count reads a list length and checks that the rest of the input could
// hold that many items of at least min bytes each.
func (d *decoder) count(min int) int {
	n := d.uvarint()
	if d.err != nil {
		return 0
	}
	if n > uint64(len(d.b)-d.off)/uint64(min) {
		d.fail("count %d exceeds the remaining %d bytes", n, len(d.b)-d.off)
		return 0
	}
	return int(n)
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b)-d.off {
		d.fail("truncated")
		return nil
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p
}

func (d *decoder) transfers(dst []Transfer) []Transfer {
	n := d.count(4)
	for i := 0; i < n && d.err == nil; i++ {
		var t Transfer
		t.ID = d.uvarint()
		t.Req = RequestID(d.bytes(d.count(1)))
		t.First = d.int()
		nb := d.count(1 + len(hashing.BlockHash{}))
		if d.err != nil {
			break
		}
		t.Blocks = make([]BlockID, nb)
		for j := range t.Blocks {
			t.Blocks[j] = BlockID(d.int())
		}
		t.Hashes = make([]hashing.BlockHash, nb)
		for j := range t.Hashes {
			copy(t.Hashes[j][:], d.bytes(len(hashing.BlockHash{})))
		}
		dst = append(dst, t)
	}
	return dst
}

func (d *decoder) finish(what string) error {
	if d.err == nil && d.off != len(d.b) {
		d.fail("%d trailing bytes after the %s", len(d.b)-d.off, what)
	}
	return d.err
}
