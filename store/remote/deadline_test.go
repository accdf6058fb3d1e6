package remote

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// orig is a server of a memstore with options of the test's, to be spoken
// to raw.
type orig struct {
	srv           *Server
	inner         *memstore.Store
	network, addr string
	ended         endings
	// registered is the largest region the server registered with inner
	// (its staging memory), which only grows: unlike the staged gauge, it
	// cannot be missed by a test that looks late.
	registered atomic.Int64
}

// serverRegs is the memstore as the server sees it: its registrations
// are recorded in o.registered (the test's own, through o.inner, are not).
type serverRegs struct {
	*memstore.Store
	o *orig
}

func (s serverRegs) Register(r rdma.Region) error {
	for {
		m := s.o.registered.Load()
		if int64(r.Len) <= m || s.o.registered.CompareAndSwap(m, int64(r.Len)) {
			break
		}
	}
	return s.Store.Register(r)
}

// serveRaw serves a memstore of 64 MiB with opts on a unix socket, or on
// TCP at 127.0.0.1 when network is "tcp".
func serveRaw(t *testing.T, opts ServerOptions, network string) *orig {
	t.Helper()
	inner, err := memstore.New(memstore.Config{Capacity: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	o := &orig{inner: inner, network: network, ended: make(endings, 1024)}
	opts.Logger = slog.New(o.ended)
	srv, err := NewServer(serverRegs{inner, o}, opts)
	if err != nil {
		t.Fatal(err)
	}
	o.srv = srv
	var l net.Listener
	if network == "unix" {
		o.addr = filepath.Join(t.TempDir(), "kv.sock")
		l, err = Listen("unix", o.addr)
	} else {
		l, err = Listen("tcp", "127.0.0.1:0")
		if err == nil {
			o.addr = l.Addr().String()
		}
	}
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
	return o
}

// raw dials o without a handshake.
func (o *orig) raw(t *testing.T) net.Conn {
	t.Helper()
	nc, err := net.Dial(o.network, o.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// hello dials o and makes the handshake of a client without a secret.
func (o *orig) hello(t *testing.T) net.Conn {
	t.Helper()
	nc := o.raw(t)
	if _, err := nc.Write(frame(msgHello, 1, nonce(), nil)); err != nil {
		t.Fatal(err)
	}
	if h, _ := readFrame(t, nc); h.typ != msgHelloReply {
		t.Fatalf("reply to a hello of type %d, want %d", h.typ, msgHelloReply)
	}
	return nc
}

// waitEnded waits for a connection's end whose error says want.
func (o *orig) waitEnded(t *testing.T, want string) {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case err := <-o.ended:
			if err != nil && strings.Contains(err.Error(), want) {
				return
			}
		case <-timer.C:
			t.Fatalf("no connection ended with an error saying %q in %v", want, bound)
		}
	}
}

// waitStaged waits until the server holds staging memory that matches ok.
func (o *orig) waitStaged(t *testing.T, what string, ok func(int64) bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for !ok(o.srv.staged.Load()) {
		select {
		case <-tick.C:
		case <-timer.C:
			t.Fatalf("%s: the server holds %d bytes of staging memory after %v", what, o.srv.staged.Load(), bound)
		}
	}
}

// TestSilentConns opens MaxConns connections that send nothing: the
// server drops each once its HelloTimeout passes, and a real client that
// dials meanwhile is served once they are gone.
func TestSilentConns(t *testing.T) {
	o := serveRaw(t, ServerOptions{HelloTimeout: 500 * time.Millisecond}, "unix")
	for range DefaultMaxConns {
		o.raw(t) // silent, and kept open
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		c, err := Dial(context.Background(), "unix", o.addr, ClientOptions{Conns: 1})
		if err == nil {
			c.Close()
			break
		}
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Dial while %d silent connections are open = %v, want store.ErrUnavailable or the client served", DefaultMaxConns, err)
		}
		select {
		case <-timer.C:
			t.Fatalf("a client was refused for %v after %d silent connections: %v", bound, DefaultMaxConns, err)
		default:
		}
	}
	o.waitEnded(t, "no hello within HelloTimeout 500ms")
}

// TestStalledFrame stops frames part way: after a header's first bytes,
// after a put's header and a MiB of its 8 MiB value, and in a get's reply
// that the client never reads. Each connection ends once FrameTimeout
// passes with no progress, with an error naming it, and the staging
// memory of the put and the get is freed then.
func TestStalledFrame(t *testing.T) {
	const size = 8 << 20
	t.Run("Header", func(t *testing.T) {
		o := serveRaw(t, ServerOptions{FrameTimeout: 200 * time.Millisecond}, "unix")
		nc := o.hello(t)
		if _, err := nc.Write(frame(msgStats, 2, nil, nil)[:10]); err != nil {
			t.Fatal(err)
		}
		o.waitEnded(t, "stalled for FrameTimeout 200ms")
	})
	t.Run("Put", func(t *testing.T) {
		o := serveRaw(t, ServerOptions{FrameTimeout: 200 * time.Millisecond}, "unix")
		nc := o.hello(t)
		f := putFrame(2, "stalled", value(size))
		if _, err := nc.Write(f[:len(f)-size+1<<20]); err != nil {
			t.Fatal(err)
		}
		o.waitEnded(t, "stalled for FrameTimeout 200ms")
		o.waitStaged(t, "after a put stalled", func(n int64) bool { return n == 0 })
		if got := o.srv.staged.Load(); got != 0 {
			t.Errorf("the server holds %d bytes of staging memory after a stalled put ended, want 0", got)
		}
	})
	t.Run("UnreadReply", func(t *testing.T) {
		o := serveRaw(t, ServerOptions{FrameTimeout: 200 * time.Millisecond}, "unix")
		mem, err := rdma.AllocHost(size)
		if err != nil {
			t.Skipf("needs host memory: %v", err)
		}
		defer mem.Free()
		copy(mem.Bytes(), value(size))
		if err := o.inner.Register(mem.Region()); err != nil {
			t.Fatal(err)
		}
		res := make([]store.Result, 1)
		if err := o.inner.Put(context.Background(), []string{"big"}, []rdma.Region{mem.Region()}, res); err != nil || res[0].Err != nil {
			t.Fatalf("Put(big) = %v, %v", err, res[0].Err)
		}
		nc := o.hello(t)
		if _, err := nc.Write(frame(msgGet, 2, enc(nil).u32(1).str("big").u64(size), nil)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for o.registered.Load() < size {
			if time.Since(start) > bound {
				t.Fatalf("the server registered no staging memory of %d bytes for a get of 8 MiB in %v", size, bound)
			}
			time.Sleep(time.Millisecond)
		}
		// The reply is never read: the socket's buffers fill, and the
		// server's write stalls.
		o.waitEnded(t, "stalled for FrameTimeout 200ms")
		o.waitStaged(t, "after a reply that was never read", func(n int64) bool { return n == 0 })
	})
}

// TestRefusalsBounded serves MaxConns 1 with a HelloTimeout of ten
// minutes: a silent connection is served, a second silent one is being
// refused, and a third is closed at once, unanswered, as MaxConns
// refusals are under way; the second, once it sends its hello, is told
// why it is refused.
func TestRefusalsBounded(t *testing.T) {
	o := serveRaw(t, ServerOptions{MaxConns: 1, HelloTimeout: 10 * time.Minute}, "unix")
	o.raw(t) // served, silent
	refusing := o.raw(t)
	third := o.raw(t)
	if err := third.SetReadDeadline(time.Now().Add(bound)); err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	if n, err := third.Read(b[:]); !errors.Is(err, io.EOF) {
		t.Errorf("a connection beyond MaxConns 1 with a refusal under way: Read = %d, %v; want it closed at once (EOF)", n, err)
	}
	if _, err := refusing.Write(frame(msgHello, 1, nonce(), nil)); err != nil {
		t.Fatal(err)
	}
	h, body := readFrame(t, refusing)
	if err := replyError(body); h.typ != msgReply || !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "MaxConns") {
		t.Errorf("the hello of a connection beyond MaxConns 1 = type %d, %v; want a reply naming MaxConns", h.typ, err)
	}
}
