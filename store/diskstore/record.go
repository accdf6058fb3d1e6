package diskstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/kvconnect/kvconnect/store"
)

// A segment file is a sequence of records, each starting at a multiple of
// 8 bytes. A record is a 32-byte header, the key, padding, and the value:
//
//	offset  size  field
//	0       4     magic "KVD1"
//	4       1     kind: 1 value, 2 tombstone (the key was removed),
//	              3 clear (every record before this one is removed)
//	5       1     zero
//	6       2     key length (0 for clear, 1..512 otherwise)
//	8       8     value length (0 for tombstone and clear)
//	16      4     value offset from the record's start
//	20      4     CRC-32C of the value
//	24      4     zero
//	28      4     CRC-32C of bytes 0..28 and the key
//
// The value starts at the record's start plus the value offset: right
// after the key rounded up to 8 bytes, or, for a value that direct I/O can
// read (see alignedValue), at the next multiple of 4096 in the file. All
// integers are little endian.
const (
	headerSize = 32
	recAlign   = 8
	pageSize   = 4096

	kindValue     = 1
	kindTombstone = 2
	kindClear     = 3
)

var magic = [4]byte{'K', 'V', 'D', '1'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// alignedValue reports whether a value of size bytes is laid out at a
// page boundary, so that a read into page-aligned memory can bypass the
// page cache: whole pages of at least 16 KiB (KV blocks are).
func alignedValue(size int) bool { return size >= 4*pageSize && size%pageSize == 0 }

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// valueOffset is where, from the record's start at off, the value of a
// record of klen key bytes and size value bytes starts.
func valueOffset(off int64, klen, size int) int64 {
	end := off + headerSize + int64(klen)
	if alignedValue(size) {
		return roundUp(end, pageSize) - off
	}
	return roundUp(end, recAlign) - off
}

// recordEnd is where the next record after one at off starts.
func recordEnd(off int64, klen, size int) int64 {
	return roundUp(off+valueOffset(off, klen, size)+int64(size), recAlign)
}

// header is a decoded record header.
type header struct {
	kind     byte
	klen     int
	size     int64
	valueOff int64
	crc      uint32
}

// putHeader writes the header and key of a record at off into b, which
// holds at least valueOffset bytes; the padding after the key is zeroed.
func putHeader(b []byte, kind byte, key string, size int, off int64, crc uint32) {
	vo := valueOffset(off, len(key), size)
	copy(b[0:4], magic[:])
	b[4] = kind
	b[5] = 0
	binary.LittleEndian.PutUint16(b[6:8], uint16(len(key)))
	binary.LittleEndian.PutUint64(b[8:16], uint64(size))
	binary.LittleEndian.PutUint32(b[16:20], uint32(vo))
	binary.LittleEndian.PutUint32(b[20:24], crc)
	binary.LittleEndian.PutUint32(b[24:28], 0)
	copy(b[headerSize:], key)
	clear(b[headerSize+len(key) : vo])
	h := crc32.Update(0, castagnoli, b[:28])
	h = crc32.Update(h, castagnoli, b[headerSize:headerSize+len(key)])
	binary.LittleEndian.PutUint32(b[28:32], h)
}

// parseHeader decodes the header of the record at off of a segment file
// of fileSize bytes from b, which holds the header and the key (b may be
// longer), and returns it with the key, which aliases b. Errors name the
// field at fault.
func parseHeader(b []byte, off, fileSize int64) (header, []byte, error) {
	if len(b) < headerSize {
		return header{}, nil, fmt.Errorf("header cut short: %d of %d bytes", len(b), headerSize)
	}
	if [4]byte(b[0:4]) != magic {
		return header{}, nil, fmt.Errorf("magic %q, want %q", b[0:4], magic[:])
	}
	h := header{
		kind:     b[4],
		klen:     int(binary.LittleEndian.Uint16(b[6:8])),
		valueOff: int64(binary.LittleEndian.Uint32(b[16:20])),
		crc:      binary.LittleEndian.Uint32(b[20:24]),
	}
	size := binary.LittleEndian.Uint64(b[8:16])
	switch {
	case h.kind < kindValue || h.kind > kindClear:
		return h, nil, fmt.Errorf("kind %d: unknown", h.kind)
	case h.kind == kindClear && h.klen != 0:
		return h, nil, fmt.Errorf("key length %d: a clear record has none", h.klen)
	case h.kind != kindClear && (h.klen < 1 || h.klen > store.MaxKeyLen):
		return h, nil, fmt.Errorf("key length %d: outside [1, %d]", h.klen, store.MaxKeyLen)
	case h.kind != kindValue && size != 0:
		return h, nil, fmt.Errorf("value length %d: a record of kind %d has none", size, h.kind)
	case size > uint64(fileSize):
		return h, nil, fmt.Errorf("value length %d: larger than the file's %d bytes", size, fileSize)
	}
	h.size = int64(size)
	if want := valueOffset(off, h.klen, int(size)); h.valueOff != want {
		return h, nil, fmt.Errorf("value offset %d, want %d", h.valueOff, want)
	}
	if end := off + h.valueOff + h.size; end > fileSize {
		return h, nil, fmt.Errorf("value of %d bytes ends at %d, past the file's end at %d (torn write)", h.size, end, fileSize)
	}
	if len(b) < headerSize+h.klen {
		return h, nil, fmt.Errorf("key cut short: %d of %d bytes", len(b)-headerSize, h.klen)
	}
	key := b[headerSize : headerSize+h.klen]
	sum := crc32.Update(0, castagnoli, b[:28])
	sum = crc32.Update(sum, castagnoli, key)
	if got := binary.LittleEndian.Uint32(b[28:32]); got != sum {
		return h, nil, fmt.Errorf("header checksum %#08x, want %#08x", got, sum)
	}
	if h.kind != kindClear {
		for i, c := range key {
			if c < 0x21 || c > 0x7e {
				return h, nil, fmt.Errorf("%w: key %.64q has byte %#x at %d", store.ErrInvalidKey, key, c, i)
			}
		}
	}
	return h, key, nil
}
