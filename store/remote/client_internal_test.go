package remote

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// innerClient returns the *client behind c.
func innerClient(t *testing.T, c Client) *client {
	t.Helper()
	switch c := c.(type) {
	case *client:
		return c
	case *leaserClient:
		return c.client
	case *watcherClient:
		return c.client
	case *leaserWatcherClient:
		return c.client
	}
	t.Fatalf("Dial returned a %T", c)
	return nil
}

// TestCallIDWrap runs calls across the wrap-around of the client's call
// ids: every call is served, none is taken for one a cancel named.
func TestCallIDWrap(t *testing.T) {
	r := newRig(t)
	cl, err := Dial(context.Background(), "unix", r.path, ClientOptions{Conns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c := innerClient(t, cl)
	c.ids.Store(math.MaxUint32 - 2)
	res := make([]store.Result, 1)
	for i := range 5 {
		id := c.ids.Load()
		if err := cl.Exists(context.Background(), []string{"wrap"}, res); err != nil || !errors.Is(res[0].Err, store.ErrNotFound) {
			t.Errorf("Exists(wrap) after call id %d = %v, %+v; want store.ErrNotFound", id, err, res[0])
		}
		if i == 4 && c.ids.Load() > 10 {
			t.Errorf("call ids did not wrap around: the last is %d", c.ids.Load())
		}
	}
}

// TestNextID: the ids of calls skip 0 when they wrap around.
func TestNextID(t *testing.T) {
	var c client
	c.ids.Store(math.MaxUint32 - 1)
	for _, want := range []uint32{math.MaxUint32, 1, 2} {
		if got := c.nextID(); got != want {
			t.Errorf("nextID() = %d, want %d", got, want)
		}
	}
}

// TestRequestIDZero sends a request of id 0 on a new connection: the
// server serves it; no cancel named it.
func TestRequestIDZero(t *testing.T) {
	r := newRig(t)
	nc := r.conn(t)
	if _, err := nc.Write(frame(msgExists, 0, enc(nil).u32(1).str("zero"), nil)); err != nil {
		t.Fatal(err)
	}
	h, body := readFrame(t, nc)
	d := dec{b: body}
	code, msg := d.u8(), d.str()
	if h.typ != msgReply || h.id != 0 || code != codeOK {
		t.Errorf("reply to an exists of id 0 = type %d id %d code %d %q, want a reply of id 0 with code 0", h.typ, h.id, code, msg)
	}
}

// readRequest reads a whole frame from nc, checking its checksum.
func readRequest(nc net.Conn) (header, error) {
	var hdr [headerLen]byte
	if _, err := io.ReadFull(nc, hdr[:]); err != nil {
		return header{}, err
	}
	h, err := parseHeader(hdr[:], 1<<20)
	if err != nil {
		return header{}, err
	}
	if h.data > 1<<20 {
		return header{}, fmt.Errorf("request of %d data bytes", h.data)
	}
	crc := crc32Of(hdr[:])
	rest := make([]byte, uint64(h.body)+h.data)
	if err := readFull(nc, rest, &crc); err != nil {
		return header{}, err
	}
	return h, readTrailer(nc, crc)
}

// fakeLimits are the limits the fake server of FuzzClientReply declares.
var fakeLimits = Limits{MaxValue: 1 << 16, MaxBatch: 4, MaxCallBytes: 1 << 16}

// fakeServe answers the hello of nc properly, then the request after it
// with the bytes reply(id) returns for the request's id, and closes nc.
func fakeServe(nc net.Conn, reply func(id uint32) []byte) error {
	defer nc.Close()
	h, err := readRequest(nc)
	if err != nil {
		return err
	}
	if h.typ != msgHello {
		return fmt.Errorf("first frame of type %d, want a hello", h.typ)
	}
	l := fakeLimits
	body := enc(nil).u64(uint64(l.MaxValue)).u32(uint32(l.MaxBatch)).u64(uint64(l.MaxCallBytes)).u8(0).u8(0).u8(0).u64(0).u64(0).u8(0)
	body = append(body, make([]byte, nonceLen)...)
	body = body.u8(0)
	if _, err := nc.Write(frame(msgHelloReply, h.id, body, nil)); err != nil {
		return err
	}
	if h, err = readRequest(nc); err != nil {
		return err
	}
	_, err = nc.Write(reply(h.id))
	return err
}

// verifiedReply returns the body and data of w if w starts with a whole
// reply frame to call id whose checksums match.
func verifiedReply(w []byte, id uint32) (body, data []byte, ok bool) {
	if len(w) < headerLen {
		return nil, nil, false
	}
	h, err := parseHeader(w[:headerLen], math.MaxUint32)
	if err != nil || h.typ != msgReply || h.id != id {
		return nil, nil, false
	}
	end := uint64(headerLen) + uint64(h.body) + h.data
	if h.data > uint64(len(w)) || end+trailerLen > uint64(len(w)) {
		return nil, nil, false
	}
	if binary.LittleEndian.Uint32(w[end:]) != crc32Of(w[:end]) {
		return nil, nil, false
	}
	return w[headerLen : headerLen+h.body], w[headerLen+h.body : end], true
}

// FuzzClientReply answers a client's Get of one key or Exists of two with
// a reply frame of the given body and data, one bit of it flipped (flip,
// when not 0) and cut short (cut, when not 0), and closes the connection.
// The client must return, with per-key errors or a call error the reply
// carried; it reports success, or a call error, only from a reply whose
// checksums match, and a Get writes the value's bytes into its
// destination and nothing outside it.
func FuzzClientReply(f *testing.F) {
	ok := callReply(nil, nil, 0, []store.Result{{N: 5}})
	f.Add(false, []byte(ok), []byte("hello"), uint32(0), uint32(0))
	f.Add(false, []byte(callReply(nil, nil, 0, []store.Result{{Err: store.ErrNotFound}})), []byte(nil), uint32(0), uint32(0))
	f.Add(false, []byte(callReply(nil, store.ErrNoSpace, 0, nil)), []byte(nil), uint32(0), uint32(0))
	f.Add(false, []byte(ok), []byte("hello"), uint32((headerLen+len(ok)+2)<<3|1), uint32(0))
	f.Add(false, []byte(ok), []byte("hello"), uint32(0), uint32(headerLen+len(ok)+3))
	f.Add(true, []byte(callReply(nil, nil, 0, []store.Result{{N: 10}, {Err: store.ErrNotFound}})), []byte(nil), uint32(0), uint32(0))
	f.Add(true, []byte(callReply(nil, nil, 0, []store.Result{{N: 0}, {N: 0}})), []byte(nil), uint32(0), uint32(0))
	f.Add(true, []byte(callReply(nil, nil, 0, []store.Result{{N: 10}, {N: 7}})), []byte(nil), uint32(9<<3|2), uint32(0))

	path := filepath.Join(f.TempDir(), "fake.sock")
	l, err := Listen("unix", path)
	if err != nil {
		f.Fatal(err)
	}
	defer l.Close()
	mem, err := rdma.AllocHost(3 * 4096)
	if errors.Is(err, rdma.ErrUnsupported) {
		f.Skipf("needs host memory: %v", err)
	}
	if err != nil {
		f.Fatal(err)
	}
	defer mem.Free()
	dst, err := mem.Region().Sub(4096, 4096)
	if err != nil {
		f.Fatal(err)
	}
	const canary = 0xa5

	f.Fuzz(func(t *testing.T, exists bool, body, data []byte, flip, cut uint32) {
		var sent []byte
		var id uint32
		served := make(chan error, 1)
		go func() {
			nc, err := l.Accept()
			if err != nil {
				served <- err
				return
			}
			served <- fakeServe(nc, func(reqID uint32) []byte {
				w := frame(msgReply, reqID, body, data)
				if flip != 0 {
					w[int(flip>>3)%len(w)] ^= 1 << (flip & 7)
				}
				if cut != 0 {
					w = w[:int(cut)%len(w)]
				}
				sent, id = w, reqID
				return w
			})
		}()
		ctx := context.Background()
		c, err := Dial(ctx, "unix", path, ClientOptions{Conns: 1, CallTimeout: bound})
		if err != nil {
			t.Fatalf("Dial of the fake server = %v", err)
		}
		defer c.Close()
		if err := c.Register(mem.Region()); err != nil {
			t.Fatal(err)
		}
		b := mem.Bytes()
		for i := range b {
			b[i] = canary
		}
		n := 1
		if exists {
			n = 2
		}
		res := make([]store.Result, n)
		called := make(chan error, 1)
		go func() {
			if exists {
				called <- c.Exists(ctx, []string{"a", "b"}, res)
			} else {
				called <- c.Get(ctx, []string{"a"}, []rdma.Region{dst}, res)
			}
		}()
		var callErr error
		select {
		case callErr = <-called:
		case <-time.After(bound):
			t.Fatalf("the client did not return within %v of a reply and the connection's end", bound)
		}
		if err := <-served; err != nil {
			t.Fatalf("the fake server: %v", err)
		}
		_, value, verified := verifiedReply(sent, id)
		if callErr != nil && !verified {
			t.Errorf("call error %v from a reply that does not check", callErr)
		}
		for i, r := range res {
			if callErr != nil || r.Err != nil {
				continue // a call error leaves the results unset
			}
			if !verified {
				t.Errorf("key %d: success %+v from a reply that does not check", i, r)
			}
			if r.N < 0 || !exists && (r.N < 1 || r.N > dst.Len) {
				t.Errorf("key %d: success with N %d", i, r.N)
			}
			if !exists && (r.N != len(value) || !bytes.Equal(dst.Bytes()[:r.N], value)) {
				t.Errorf("Get: success of %d bytes, but the reply's %d data bytes are not what the destination holds", r.N, len(value))
			}
		}
		if !exists {
			for i, v := range b {
				if (i < 4096 || i >= 2*4096) && v != canary {
					t.Fatalf("Get wrote byte %d of the registered memory, outside its destination [4096, 8192)", i)
				}
			}
		}
	})
}
