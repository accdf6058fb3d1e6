package remote

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/kvconnect/kvconnect/store"
)

// The wire format. Every message, both ways, is one frame:
//
//	offset  size  field
//	0       4     magic "KVRS"
//	4       1     version, 2
//	5       1     type (msgHello ...)
//	6       2     zero
//	8       4     call id: a reply carries its request's; a cancel names the call it cancels;
//	              a client's hellos and requests count up from 1, skipping 0
//	12      4     body length
//	16      8     data length: value bytes after the body
//	24      4     CRC-32C (Castagnoli) of bytes 0 to 24
//	28      body  the message's fields, little endian
//	        data  value bytes (put requests, get replies)
//	        4     CRC-32C of the header, the body and the data
//
// The header's own checksum lets a reader refuse a corrupt length before
// it trusts it; the trailer covers every byte of the frame, value bytes
// included, and a frame is acted on only once its trailer checks: a torn
// or corrupted put stores nothing, a torn or corrupted get reply reports
// every key of the call failed with store.ErrTransfer. A reader that meets
// a bad frame closes the connection, as it can no longer find the next
// frame.
//
// Strings (str) are a uint16 length and the bytes. Bodies:
//
//	hello         32 bytes: the client's nonce; answered with a helloReply,
//	              or with a reply carrying the error of a server that
//	              refuses the connection (store.ErrUnavailable: it serves
//	              MaxConns)
//	helloReply    u64 MaxValue, u32 MaxBatch, u64 MaxCallBytes, u8 leaser,
//	              u8 Leases.Exists, u8 Leases.Get, i64 TTL ns, i64 RemoveWait ns,
//	              u8 watcher, 32 bytes: the server's nonce, u8 auth, and when
//	              auth is 1, 32 bytes: the server's proof
//	auth          32 bytes: the client's proof; sent after a helloReply
//	              whose auth is 1, and answered with a reply (code 0, or
//	              the error of a wrong proof, after which the server closes
//	              the connection)
//	watch         u32 n: the events the server's feed holds; answered with
//	              a reply, then, on success, a stream of events frames of
//	              the same call id for as long as the connection lasts
//	events        u64 lost, u32 n, n × (str key, u8 op, str medium)
//	exists        u32 n, n × str key
//	put           u32 n, n × (str key, u64 size); data: the values in order
//	get           u32 n, n × (str key, u64 destination length)
//	remove        str key
//	removePrefix  str prefix
//	removeAll     (empty)
//	stats         (empty)
//	statsReply    12 × i64: the fields of store.Stats in order
//	cancel        (empty): cancels the call whose id the header carries
//	reply         u8 code, str message (the call's error), u64 count (removals),
//	              u32 n, n × (u8 code, u64 N, str message if code is not 0);
//	              data (get): the values of the keys whose code is 0, in order,
//	              N bytes each
//
// The proofs of the shared secret (ServerOptions.Secret, ClientOptions.Secret)
// are HMAC-SHA256 under the secret of a role label and both nonces (see
// proof): each side proves it holds the secret over a nonce the other just
// drew, so the secret never crosses the wire and a recorded exchange
// proves nothing on a new connection.
//
// Error codes are 0 for none and the codes below, one per sentinel error of
// package store; the message is the server's error text.
const (
	frameMagic   = "KVRS"
	frameVersion = 2
	headerLen    = 28
	trailerLen   = 4
	maxMessage   = 1024 // longest error text sent
)

// Message types.
const (
	msgHello byte = iota + 1
	msgHelloReply
	msgExists
	msgPut
	msgGet
	msgRemove
	msgRemovePrefix
	msgRemoveAll
	msgStats
	msgStatsReply
	msgCancel
	msgReply
	msgAuth
	msgWatch
	msgEvents
)

// nonceLen is the length of the hello's nonces, and proofLen that of the
// proofs of the shared secret.
const (
	nonceLen = 32
	proofLen = sha256.Size
)

// The role labels of the proofs: a server's proof is never a client's.
const (
	labelServer = "kvconnect/store/remote v2 server proof"
	labelClient = "kvconnect/store/remote v2 client proof"
)

// proof returns HMAC-SHA256 under secret of label, the client's nonce and
// the server's.
func proof(secret []byte, label string, clientNonce, serverNonce []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(clientNonce)
	m.Write(serverNonce)
	return m.Sum(nil)
}

// checkProof reports whether got is the proof of label under secret.
func checkProof(got, secret []byte, label string, clientNonce, serverNonce []byte) bool {
	return hmac.Equal(got, proof(secret, label, clientNonce, serverNonce))
}

// nonce returns a fresh random nonce.
func nonce() []byte {
	b := make([]byte, nonceLen)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return b
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// header is a decoded frame header.
type header struct {
	typ  byte
	id   uint32
	body uint32
	data uint64
}

// putHeader encodes h into b[:headerLen].
func putHeader(b []byte, h header) {
	copy(b[0:4], frameMagic)
	b[4] = frameVersion
	b[5] = h.typ
	b[6], b[7] = 0, 0
	binary.LittleEndian.PutUint32(b[8:], h.id)
	binary.LittleEndian.PutUint32(b[12:], h.body)
	binary.LittleEndian.PutUint64(b[16:], h.data)
	binary.LittleEndian.PutUint32(b[24:], crc32.Checksum(b[:24], castagnoli))
}

// errFrame is the error of a frame that is not well formed.
var errFrame = errors.New("remote: bad frame")

// parseHeader decodes b[:headerLen], refusing a bad magic, version or
// checksum, and a body longer than maxBody.
func parseHeader(b []byte, maxBody uint32) (header, error) {
	if string(b[0:4]) != frameMagic {
		return header{}, fmt.Errorf("%w: magic %q, want %q", errFrame, b[0:4], frameMagic)
	}
	if b[4] != frameVersion {
		return header{}, fmt.Errorf("%w: protocol version %d, want %d", errFrame, b[4], frameVersion)
	}
	if got, want := binary.LittleEndian.Uint32(b[24:]), crc32.Checksum(b[:24], castagnoli); got != want {
		return header{}, fmt.Errorf("%w: header checksum %#08x, want %#08x", errFrame, got, want)
	}
	h := header{typ: b[5], id: binary.LittleEndian.Uint32(b[8:]), body: binary.LittleEndian.Uint32(b[12:]), data: binary.LittleEndian.Uint64(b[16:])}
	if h.body > maxBody {
		return header{}, fmt.Errorf("%w: body of %d bytes, at most %d allowed", errFrame, h.body, maxBody)
	}
	return h, nil
}

func crc32Of(b []byte) uint32               { return crc32.Checksum(b, castagnoli) }
func updateCRC(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

// readFull reads len(b) bytes of a frame past its header into b and adds
// them to the running checksum. The end of the stream is
// io.ErrUnexpectedEOF there, even before the first of these bytes.
func readFull(r io.Reader, b []byte, crc *uint32) error {
	if _, err := io.ReadFull(r, b); err != nil {
		return midFrame(err)
	}
	*crc = crc32.Update(*crc, castagnoli, b)
	return nil
}

// readTrailer reads a frame's trailer and checks it against crc.
func readTrailer(r io.Reader, crc uint32) error {
	var b [trailerLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return midFrame(err)
	}
	if got := binary.LittleEndian.Uint32(b[:]); got != crc {
		return fmt.Errorf("%w: frame checksum %#08x, want %#08x", errFrame, got, crc)
	}
	return nil
}

func midFrame(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// enc appends the fields of a body.
type enc []byte

func (e enc) u8(v byte) enc    { return append(e, v) }
func (e enc) u32(v uint32) enc { return binary.LittleEndian.AppendUint32(e, v) }
func (e enc) u64(v uint64) enc { return binary.LittleEndian.AppendUint64(e, v) }
func (e enc) str(s string) enc {
	if len(s) > 0xffff {
		s = s[:0xffff]
	}
	return append(binary.LittleEndian.AppendUint16(e, uint16(len(s))), s...)
}

// dec reads the fields of a body; after a short read every field is zero
// and err is set.
type dec struct {
	b   []byte
	err error
}

func (d *dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.err = fmt.Errorf("%w: body ends %d bytes short", errFrame, n-len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) u8() byte {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *dec) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *dec) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// str returns a string that aliases the body: valid until the body's
// buffer is reused.
func (d *dec) bytes16() []byte {
	b := d.take(2)
	if b == nil {
		return nil
	}
	return d.take(int(binary.LittleEndian.Uint16(b)))
}

func (d *dec) str() string { return string(d.bytes16()) }

// end fails d if bytes are left over.
func (d *dec) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d bytes past the body's fields", errFrame, len(d.b))
	}
	return d.err
}

// Error codes, one per sentinel of package store, and for the context's
// errors and errors that match none.
const (
	codeOK byte = iota
	codeNotFound
	codeNoSpace
	codeLeaseExpired
	codeHasLease
	codeBufferTooSmall
	codeInvalidKey
	codeInvalidRegion
	codeTransfer
	codeClosed
	codeUnavailable
	codeCanceled
	codeDeadline
	codeOther
)

// sentinels maps codes to errors; codeOther has none.
var sentinels = [...]error{
	codeNotFound:       store.ErrNotFound,
	codeNoSpace:        store.ErrNoSpace,
	codeLeaseExpired:   store.ErrLeaseExpired,
	codeHasLease:       store.ErrHasLease,
	codeBufferTooSmall: store.ErrBufferTooSmall,
	codeInvalidKey:     store.ErrInvalidKey,
	codeInvalidRegion:  store.ErrInvalidRegion,
	codeTransfer:       store.ErrTransfer,
	codeClosed:         store.ErrClosed,
	codeUnavailable:    store.ErrUnavailable,
	codeCanceled:       context.Canceled,
	codeDeadline:       context.DeadlineExceeded,
	codeOther:          nil,
}

// codeOf returns the code of err: that of the first sentinel it matches.
func codeOf(err error) byte {
	if err == nil {
		return codeOK
	}
	for c := codeNotFound; c < codeOther; c++ {
		if errors.Is(err, sentinels[c]) {
			return c
		}
	}
	return codeOther
}

// message returns err's text, cut to maxMessage bytes.
func message(err error) string {
	s := err.Error()
	if len(s) > maxMessage {
		s = s[:maxMessage]
	}
	return s
}

// serverError is an error that crossed the wire: the server's text, and
// the sentinel its code names, for errors.Is.
type serverError struct {
	msg string
	err error // nil for codeOther
}

func (e *serverError) Error() string { return e.msg }
func (e *serverError) Unwrap() error { return e.err }

// decodeError rebuilds the error of code and msg; nil for codeOK.
func decodeError(code byte, msg string) error {
	switch {
	case code == codeOK:
		return nil
	case int(code) >= len(sentinels):
		return &serverError{msg: fmt.Sprintf("remote: unknown error code %d: %s", code, msg)}
	}
	return &serverError{msg: msg, err: sentinels[code]}
}
