package connector

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"

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

// Transfer is a run of one request's blocks of one KV cache group to load
// or save.
type Transfer struct {
	ID     uint64              // unique among the connector's transfers
	Req    RequestID           // the request the blocks belong to
	Group  int                 // the KV cache group (its index in the layout's groups); 0 with one group
	First  int                 // index of Blocks[0] in the request's block table of Group
	Blocks []BlockID           // engine blocks of Group, the same in every worker
	Hashes []hashing.BlockHash // Hashes[i] is the hash of Blocks[i]'s tokens: the chain's hash of the prefix that ends with it
	// Params are the connector's own parameters of the transfer, opaque
	// to the engine, which ships them to the workers unchanged (the P2P
	// connector's: where the producer's blocks are); nil for none. A
	// connector whose workers are other processes needs them: the
	// Metadata is all that reaches those workers.
	Params []byte
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

// Wire format, version 4. Every encoding is one frame: a header, a body
// and a checksum over both.
//
//	frame    = magic version length body checksum
//	magic    = "KVM" (a Metadata) | "KVO" (an Output)
//	version  = 0x04
//	length   = uint32, little-endian: the number of bytes in body
//	body     = metadata | output, as magic says
//	checksum = uint32, little-endian: CRC-32 (IEEE) of magic, version,
//	           length and body, every byte before it
//
//	metadata = step generation nloads transfer* nsaves transfer*
//	transfer = id nreq byte* group first nblocks block* hash* nparams byte*
//	output   = rank ndone id* nfailed failure*
//	failure  = transfer index reason
//
// In the body, integers are unsigned varints, signed ones (group, first,
// block, rank, index) zig-zag varints within the range of an int32; reason is one
// byte and a hash 32 raw bytes, one per block.
//
// # Versioning
//
// The version names the whole layout of a frame. Any change that makes a
// byte mean something else bumps it: a field added, removed, reordered or
// retyped, another checksum, another integer encoding, a Reason value that
// an older decoder does not know. A decoder accepts its own version only:
// an older one is refused with an error that names both versions (the
// sender must re-encode with this version), a newer or unknown one too, so
// the scheduler half and its workers run the same version. Decoders check,
// in order, the magic, the version, the length against the frame's size
// and the checksum, and decode the body only once all of them hold: a
// truncated, extended or corrupted frame is refused before any of its
// fields is read. The checksum finds accidental corruption, not tampering:
// it is no authentication, and a party that can write frames can forge
// them.
//
// Version 4 added the params of a transfer; version 3 the group of a
// transfer; version 2 the length and the checksum.
const wireVersion = 4

// frameHeader is the size of magic, version and length; frameTrailer of
// the checksum.
const (
	frameHeader  = 4 + 4
	frameTrailer = 4
)

// The magic of each kind of frame.
const (
	metaMagic = "KVM"
	outMagic  = "KVO"
)

// checksum returns the checksum of a frame's bytes before the checksum:
// CRC-32 with the IEEE polynomial.
//
// IEEE rather than Castagnoli (CRC-32C) for speed where the checksum
// costs time. On amd64 Go computes IEEE with carry-less multiplication:
// over a frame of 64 requests × 16 blocks (70 KB) it takes 2.6 µs where
// Castagnoli's SSE4.2 instruction takes 4.5 (1.7x), and encoding and
// decoding such a frame takes 1.06x the time of its body alone, 1.09x
// with Castagnoli. Over a frame of one request (320 bytes) IEEE is about
// 1.15x as fast; only over an idle step's 18-byte frame is Castagnoli
// faster, 14 ns against 37. BenchmarkFrameChecksum measures both over the
// frames of BenchmarkMetadataWire. What Castagnoli detects beyond IEEE,
// every error of up to 3 bits also in frames over 11 KiB (Koopman,
// "32-Bit Cyclic Redundancy Codes for Internet Applications", 2002), is
// not the corruption frames meet: a bad copy or a wrong buffer changes
// whole bytes, and both polynomials detect every change confined to 32
// consecutive bits, so every change of one byte, and all but about 2^-32
// of other changes.
func checksum(p []byte) uint32 { return crc32.ChecksumIEEE(p) }

// appendHeader appends a frame header with its length left zero for
// closeFrame to fill in.
func appendHeader(b []byte, magic string) []byte {
	b = append(b, magic...)
	return append(b, wireVersion, 0, 0, 0, 0)
}

// closeFrame completes the frame that starts at b[start:], whose body
// follows its header: it fills in the length and appends the checksum.
func closeFrame(b []byte, start int, what string) ([]byte, error) {
	n := uint64(len(b) - start - frameHeader)
	if n > math.MaxUint32 {
		return b[:start], fmt.Errorf("%w: %s body of %d bytes exceeds the frame limit of %d", ErrBadMetadata, what, n, uint64(math.MaxUint32))
	}
	binary.LittleEndian.PutUint32(b[start+4:], uint32(n))
	return binary.LittleEndian.AppendUint32(b, checksum(b[start:])), nil
}

// openFrame checks the framing of data, in the order the versioning policy
// gives, and returns its body.
func openFrame(data []byte, magic, what string) ([]byte, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s frame: %s", ErrBadMetadata, what, fmt.Sprintf(format, args...))
	}
	if len(data) < len(magic) || string(data[:len(magic)]) != magic {
		return nil, bad("bad magic %q, want %q", data[:min(len(magic), len(data))], magic)
	}
	if len(data) > len(magic) {
		switch v := data[len(magic)]; {
		case v >= 1 && v < wireVersion:
			return nil, bad("wire version %d is no longer accepted: re-encode with version %d", v, wireVersion)
		case v != wireVersion:
			return nil, bad("unknown wire version %d, want %d", v, wireVersion)
		}
	}
	if len(data) < frameHeader+frameTrailer {
		return nil, bad("truncated: %d bytes, less than the %d of header and checksum", len(data), frameHeader+frameTrailer)
	}
	n, have := uint64(binary.LittleEndian.Uint32(data[4:])), uint64(len(data)-frameHeader-frameTrailer)
	switch {
	case n > have:
		return nil, bad("truncated: length %d, but %d body bytes before the checksum", n, have)
	case n < have:
		return nil, bad("length %d, but %d body bytes before the checksum (%d bytes appended?)", n, have, have-n)
	}
	end := len(data) - frameTrailer
	want := binary.LittleEndian.Uint32(data[end:])
	if got := checksum(data[:end]); got != want {
		return nil, bad("checksum mismatch: expected %#08x (in the frame), computed %#08x", want, got)
	}
	return data[frameHeader:end], nil
}

// MarshalBinary encodes m as one frame of the versioned wire format.
func (m *Metadata) MarshalBinary() ([]byte, error) { return m.AppendBinary(nil) }

// AppendBinary appends the encoding of m to b. It allocates only when b
// lacks the capacity. On error it returns b with its length unchanged.
func (m *Metadata) AppendBinary(b []byte) ([]byte, error) {
	start := len(b)
	b, err := m.appendBody(appendHeader(b, metaMagic))
	if err != nil {
		return b[:start], err
	}
	return closeFrame(b, start, "metadata")
}

func (m *Metadata) appendBody(b []byte) ([]byte, error) {
	b = binary.AppendUvarint(b, m.Step)
	b = binary.AppendUvarint(b, m.Generation)
	for _, list := range [2][]Transfer{m.Loads, m.Saves} {
		b = binary.AppendUvarint(b, uint64(len(list)))
		for i := range list {
			t := &list[i]
			if len(t.Hashes) != len(t.Blocks) {
				return b, fmt.Errorf("%w: transfer %d has %d blocks but %d hashes", ErrBadMetadata, t.ID, len(t.Blocks), len(t.Hashes))
			}
			if !fitsInt32(t.First) {
				return b, fmt.Errorf("%w: transfer %d has First = %d, outside the wire's int32 range", ErrBadMetadata, t.ID, t.First)
			}
			if t.Group < 0 || !fitsInt32(t.Group) {
				return b, fmt.Errorf("%w: transfer %d has Group = %d, want a group index in [0, 2^31)", ErrBadMetadata, t.ID, t.Group)
			}
			b = binary.AppendUvarint(b, t.ID)
			b = binary.AppendUvarint(b, uint64(len(t.Req)))
			b = append(b, t.Req...)
			b = binary.AppendVarint(b, int64(t.Group))
			b = binary.AppendVarint(b, int64(t.First))
			b = binary.AppendUvarint(b, uint64(len(t.Blocks)))
			for _, id := range t.Blocks {
				b = binary.AppendVarint(b, int64(id))
			}
			for _, h := range t.Hashes {
				b = append(b, h[:]...)
			}
			b = binary.AppendUvarint(b, uint64(len(t.Params)))
			b = append(b, t.Params...)
		}
	}
	return b, nil
}

// UnmarshalBinary decodes one frame into m, replacing its contents; the
// frame is all of data. It checks the framing and the checksum before it
// reads the body, never panics and never allocates more than the input
// can describe. On error, which wraps ErrBadMetadata, m is left empty.
func (m *Metadata) UnmarshalBinary(data []byte) error {
	body, err := openFrame(data, metaMagic, "metadata")
	if err == nil {
		err = m.decodeBody(body)
	}
	if err != nil {
		*m = Metadata{Loads: m.Loads[:0], Saves: m.Saves[:0]}
	}
	return err
}

func (m *Metadata) decodeBody(body []byte) error {
	d := decoder{b: body, what: "metadata", base: frameHeader}
	m.Step = d.uvarint()
	m.Generation = d.uvarint()
	m.Loads = d.transfers(m.Loads[:0])
	m.Saves = d.transfers(m.Saves[:0])
	return d.finish()
}

// MarshalBinary encodes o as one frame of the versioned wire format.
func (o *Output) MarshalBinary() ([]byte, error) { return o.AppendBinary(nil) }

// AppendBinary appends the encoding of o to b. It allocates only when b
// lacks the capacity. On error it returns b with its length unchanged.
func (o *Output) AppendBinary(b []byte) ([]byte, error) {
	start := len(b)
	b, err := o.appendBody(appendHeader(b, outMagic))
	if err != nil {
		return b[:start], err
	}
	return closeFrame(b, start, "output")
}

func (o *Output) appendBody(b []byte) ([]byte, error) {
	if !fitsInt32(o.Rank) {
		return b, fmt.Errorf("%w: Output.Rank = %d, outside the wire's int32 range", ErrBadMetadata, o.Rank)
	}
	b = binary.AppendVarint(b, int64(o.Rank))
	b = binary.AppendUvarint(b, uint64(len(o.Done)))
	for _, id := range o.Done {
		b = binary.AppendUvarint(b, id)
	}
	b = binary.AppendUvarint(b, uint64(len(o.Failed)))
	for _, f := range o.Failed {
		if !fitsInt32(f.Index) {
			return b, fmt.Errorf("%w: failure of transfer %d has Index = %d, outside the wire's int32 range", ErrBadMetadata, f.Transfer, f.Index)
		}
		b = binary.AppendUvarint(b, f.Transfer)
		b = binary.AppendVarint(b, int64(f.Index))
		b = append(b, byte(f.Reason))
	}
	return b, nil
}

// UnmarshalBinary decodes one frame into o, replacing its contents; the
// frame is all of data. It checks the framing and the checksum before it
// reads the body, never panics and never allocates more than the input
// can describe. On error, which wraps ErrBadMetadata, o is left empty.
func (o *Output) UnmarshalBinary(data []byte) error {
	body, err := openFrame(data, outMagic, "output")
	if err == nil {
		err = o.decodeBody(body)
	}
	if err != nil {
		*o = Output{Done: o.Done[:0], Failed: o.Failed[:0]}
	}
	return err
}

func (o *Output) decodeBody(body []byte) error {
	d := decoder{b: body, what: "output", base: frameHeader}
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
	return d.finish()
}

// fitsInt32 reports whether v is in the range the wire carries for a
// signed integer.
func fitsInt32(v int) bool { return int64(v) == int64(int32(v)) }

// decoder reads the body, b, of a frame of kind what; the body starts at
// byte base of the frame.
type decoder struct {
	b    []byte
	what string
	base int
	off  int
	err  error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s frame: at byte %d: %s", ErrBadMetadata, d.what, d.base+d.off, fmt.Sprintf(format, args...))
	}
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
		t.Group = d.int()
		if t.Group < 0 && d.err == nil {
			d.fail("transfer %d: group %d, want >= 0", t.ID, t.Group)
		}
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
		if np := d.count(1); np > 0 {
			t.Params = append([]byte(nil), d.bytes(np)...)
		}
		dst = append(dst, t)
	}
	return dst
}

func (d *decoder) finish() error {
	if d.err == nil && d.off != len(d.b) {
		d.fail("%d trailing bytes in the body", len(d.b)-d.off)
	}
	return d.err
}
