package remote

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

const bound = time.Minute

// endings is a slog.Handler that passes on the error of every
// "connection ended" record.
type endings chan error

func (e endings) Enabled(context.Context, slog.Level) bool { return true }
func (e endings) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message != "remote: connection ended" {
		return nil
	}
	var err error
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			err, _ = a.Value.Any().(error)
		}
		return true
	})
	e <- err
	return nil
}
func (e endings) WithAttrs([]slog.Attr) slog.Handler { return e }
func (e endings) WithGroup(string) slog.Handler      { return e }

// rig is a server of a memstore on a unix socket, to be spoken to raw.
type rig struct {
	inner *memstore.Store
	path  string
	ended endings
}

func newRig(t *testing.T) *rig {
	t.Helper()
	inner, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{inner: inner, path: filepath.Join(t.TempDir(), "kv.sock"), ended: make(endings, 16)}
	srv, err := NewServer(inner, ServerOptions{Logger: slog.New(r.ended)})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen("unix", r.path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(l); !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve() = %v", err)
		}
	})
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
		wg.Wait()
		if err := inner.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// conn dials the rig and makes the handshake.
func (r *rig) conn(t *testing.T) net.Conn {
	t.Helper()
	nc, err := net.Dial("unix", r.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if _, err := nc.Write(frame(msgHello, 1, make([]byte, nonceLen), nil)); err != nil {
		t.Fatal(err)
	}
	if h, _ := readFrame(t, nc); h.typ != msgHelloReply {
		t.Fatalf("reply to a hello of type %d, want %d", h.typ, msgHelloReply)
	}
	return nc
}

// waitEnded returns the error the server ended a connection with.
func (r *rig) waitEnded(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.ended:
		return err
	case <-time.After(bound):
		t.Fatalf("the server did not end the connection in %v", bound)
		return nil
	}
}

// exists reports whether the rig's store holds key.
func (r *rig) exists(t *testing.T, key string) bool {
	t.Helper()
	res := make([]store.Result, 1)
	if err := r.inner.Exists(context.Background(), []string{key}, res); err != nil {
		t.Fatal(err)
	}
	return res[0].Err == nil
}

// frame encodes a whole frame.
func frame(typ byte, id uint32, body []byte, data []byte) []byte {
	var hdr [headerLen]byte
	putHeader(hdr[:], header{typ: typ, id: id, body: uint32(len(body)), data: uint64(len(data))})
	var b bytesWriter
	var bufs net.Buffers
	if err := writeFrame(&b, &bufs, hdr[:], body, [][]byte{data}); err != nil {
		panic(err)
	}
	return b
}

type bytesWriter []byte

func (b *bytesWriter) Write(p []byte) (int, error) {
	*b = append(*b, p...)
	return len(p), nil
}

// putFrame is a put of value under key.
func putFrame(id uint32, key string, value []byte) []byte {
	body := enc(nil).u32(1).str(key).u64(uint64(len(value)))
	return frame(msgPut, id, body, value)
}

// readFrame reads a whole frame, checking its checksum.
func readFrame(t *testing.T, r io.Reader) (header, []byte) {
	t.Helper()
	var hdr [headerLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		t.Fatalf("reading a reply's header: %v", err)
	}
	h, err := parseHeader(hdr[:], 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	crc := crc32Of(hdr[:])
	rest := make([]byte, int(h.body)+int(h.data))
	if err := readFull(r, rest, &crc); err != nil {
		t.Fatal(err)
	}
	if err := readTrailer(r, crc); err != nil {
		t.Fatal(err)
	}
	return h, rest
}

func value(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

// TestRawPut stores a value with a put frame built by hand: the control
// for the tests of torn and corrupt frames below.
func TestRawPut(t *testing.T) {
	r := newRig(t)
	nc := r.conn(t)
	if _, err := nc.Write(putFrame(2, "raw/good", value(5000))); err != nil {
		t.Fatal(err)
	}
	h, body := readFrame(t, nc)
	d := dec{b: body}
	code, msg := d.u8(), d.str()
	d.u64()
	n := d.u32()
	kcode, size := d.u8(), d.u64()
	if h.typ != msgReply || h.id != 2 || code != codeOK || n != 1 || kcode != codeOK || size != 5000 || d.end() != nil {
		t.Fatalf("reply to a put = type %d id %d code %d %q, %d results: code %d size %d (%v); want one success of 5000 bytes", h.typ, h.id, code, msg, n, kcode, size, d.err)
	}
	if !r.exists(t, "raw/good") {
		t.Error("raw/good is absent after a put reported success")
	}
}

// TestTornFrame sends a put frame cut short, at several points, and
// closes the connection: the server ends it as torn, and stores nothing.
func TestTornFrame(t *testing.T) {
	r := newRig(t)
	f := putFrame(2, "raw/torn", value(5000))
	for _, cut := range []int{10, headerLen, headerLen + 5, len(f) / 2, len(f) - trailerLen, len(f) - 1} {
		nc := r.conn(t)
		if _, err := nc.Write(f[:cut]); err != nil {
			t.Fatal(err)
		}
		if err := nc.Close(); err != nil {
			t.Fatal(err)
		}
		if err := r.waitEnded(t); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("a put frame cut at byte %d of %d: the server ended the connection with %v, want %v", cut, len(f), err, io.ErrUnexpectedEOF)
		}
		if r.exists(t, "raw/torn") {
			t.Fatalf("a put frame cut at byte %d of %d stored its key", cut, len(f))
		}
	}
}

// TestCorruptFrame flips one bit of a put frame, in its header, its
// fields, its value or its trailer: the server refuses the frame, ends the
// connection, and stores nothing.
func TestCorruptFrame(t *testing.T) {
	r := newRig(t)
	good := putFrame(2, "raw/corrupt", value(5000))
	for _, at := range []int{1, 4, 13, 20, 26, headerLen + 3, headerLen + 20, len(good) / 2, len(good) - trailerLen - 1, len(good) - 2} {
		f := append([]byte(nil), good...)
		f[at] ^= 0x10
		nc := r.conn(t)
		if _, err := nc.Write(f); err != nil {
			t.Fatal(err)
		}
		err := r.waitEnded(t)
		if !errors.Is(err, errFrame) {
			t.Errorf("a put frame with byte %d of %d flipped: the server ended the connection with %v, want %v", at, len(f), err, errFrame)
		}
		if r.exists(t, "raw/corrupt") {
			t.Fatalf("a put frame with byte %d of %d flipped stored its key", at, len(f))
		}
		nc.Close()
	}
	// A frame whose value is corrupt gets a reply saying so.
	f := append([]byte(nil), good...)
	f[len(f)/2] ^= 1
	nc := r.conn(t)
	if _, err := nc.Write(f); err != nil {
		t.Fatal(err)
	}
	_, body := readFrame(t, nc)
	d := dec{b: body}
	if code, msg := d.u8(), d.str(); code != codeTransfer {
		t.Errorf("reply to a put with a corrupt value: code %d %q, want %d (store.ErrTransfer)", code, msg, codeTransfer)
	}
	r.waitEnded(t)
}

// TestErrorCodes: every sentinel crosses the wire as itself, with the
// server's text.
func TestErrorCodes(t *testing.T) {
	for c := codeNotFound; c < codeOther; c++ {
		err := errors.Join(errors.New("detail"), sentinels[c])
		got := decodeError(codeOf(err), message(err))
		if !errors.Is(got, sentinels[c]) || got.Error() != err.Error() {
			t.Errorf("decodeError(codeOf(%q)) = %q, want one matching %v with the same text", err, got, sentinels[c])
		}
	}
	if got := decodeError(codeOf(errors.New("odd")), "odd"); got == nil || got.Error() != "odd" {
		t.Errorf("an error of no sentinel crossed as %v, want its text", got)
	}
	if got := decodeError(200, "x"); got == nil {
		t.Error("an unknown code decoded as no error")
	}
}

// FuzzServer feeds the server arbitrary bytes after a handshake: it must
// neither panic nor hang, and it ends the connection when the bytes end.
func FuzzServer(f *testing.F) {
	f.Add(putFrame(2, "fuzz/a", value(100)))
	f.Add(frame(msgGet, 2, enc(nil).u32(1).str("fuzz/a").u64(4096), nil))
	f.Add(frame(msgExists, 2, enc(nil).u32(2).str("a").str("b"), nil))
	f.Add(frame(msgRemovePrefix, 2, enc(nil).str("fuzz/"), nil))
	f.Add(frame(msgCancel, 2, nil, nil))
	f.Add(append(putFrame(2, "fuzz/a", value(10)), frame(msgGet, 3, enc(nil).u32(1).str("fuzz/a").u64(4), nil)...))
	inner, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		f.Fatal(err)
	}
	defer inner.Close()
	srv, err := NewServer(inner, ServerOptions{MaxValue: 1 << 16, MaxBatch: 64})
	if err != nil {
		f.Fatal(err)
	}
	defer srv.Close()
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.serveConn(server)
		}()
		go io.Copy(io.Discard, client) // replies
		hello := frame(msgHello, 1, make([]byte, nonceLen), nil)
		if _, err := client.Write(append(hello, in...)); err != nil && !errors.Is(err, io.ErrClosedPipe) {
			t.Fatal(err)
		}
		client.Close()
		select {
		case <-done:
		case <-time.After(bound):
			t.Fatalf("the server did not end a connection in %v after its bytes ended", bound)
		}
	})
}

// FuzzEvents feeds parseEvents arbitrary bodies: it never panics, and what
// it takes is within the server's bounds and encodes back to the body.
func FuzzEvents(f *testing.F) {
	f.Add([]byte(enc(nil).u64(3).u32(1).str("k").u8(byte(store.KeyEvicted)).str("CPU")))
	f.Add([]byte(enc(nil).u64(0).u32(0)))
	f.Add([]byte(enc(nil).u64(0).u32(2).str("a").u8(1).str("")))
	f.Fuzz(func(t *testing.T, body []byte) {
		evs, lost, err := parseEvents(body)
		if err != nil {
			return
		}
		if len(evs) > eventsPerFrame || lost < 0 {
			t.Fatalf("parseEvents took %d events, %d lost", len(evs), lost)
		}
		b := enc(nil).u64(uint64(lost)).u32(uint32(len(evs)))
		for _, e := range evs {
			if !e.Op.Gone() && e.Op != store.KeyStored {
				t.Fatalf("parseEvents took op %v", e.Op)
			}
			b = b.str(e.Key).u8(byte(e.Op)).str(e.Medium)
		}
		if string(b) != string(body) {
			t.Fatalf("parseEvents(%x) = %v, %d: encodes back to %x", body, evs, lost, []byte(b))
		}
	})
}
