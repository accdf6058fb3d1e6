package remote_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/remote"
)

// flakyListener fails its first fails Accepts with err, and after them
// accepts as l does; every Accept is counted on calls.
type flakyListener struct {
	net.Listener
	err   error
	calls chan struct{}

	mu    sync.Mutex
	fails int
}

func (l *flakyListener) Accept() (net.Conn, error) {
	select {
	case l.calls <- struct{}{}:
	default:
	}
	l.mu.Lock()
	fail := l.fails > 0
	if fail {
		l.fails--
	}
	l.mu.Unlock()
	if fail {
		return nil, l.err
	}
	return l.Listener.Accept()
}

// emfile is the error of an accept that found no free file descriptor.
var emfile = &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.EMFILE)}

// serveFlaky serves a memstore on a listener that fails its first fails
// Accepts with err, and returns the socket's path, the listener and
// Serve's result.
func serveFlaky(t *testing.T, fails int, err error) (string, *remote.Server, *flakyListener, <-chan error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kv.sock")
	srv, nerr := remote.NewServer(newMemstore(t), remote.ServerOptions{})
	if nerr != nil {
		t.Fatal(nerr)
	}
	l, lerr := remote.Listen("unix", path)
	if lerr != nil {
		t.Fatal(lerr)
	}
	fl := &flakyListener{Listener: l, err: err, fails: fails, calls: make(chan struct{}, 1)}
	served := make(chan error, 1)
	go func() {
		served <- srv.Serve(fl)
		close(served)
	}()
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("server Close() = %v", err)
		}
		<-served
	})
	return path, srv, fl, served
}

// TestServeTemporaryAccept: Serve retries an Accept that fails with a
// temporary error (no file descriptor free), and serves the connections
// that come after.
func TestServeTemporaryAccept(t *testing.T) {
	path, _, _, served := serveFlaky(t, 3, emfile)
	c := dial(t, path, remote.ClientOptions{})
	res := make([]store.Result, 1)
	if err := c.Exists(context.Background(), []string{"k"}, res); err != nil || !errors.Is(res[0].Err, store.ErrNotFound) {
		t.Errorf("Exists(k) after 3 failed Accepts = %v, %+v; want store.ErrNotFound", err, res[0])
	}
	select {
	case err := <-served:
		t.Fatalf("Serve() = %v after temporary Accept errors, want it serving", err)
	default:
	}
}

// TestServeCloseWhileRetrying closes the server while Serve waits to
// retry a failed Accept: Serve returns ErrServerClosed at once.
func TestServeCloseWhileRetrying(t *testing.T) {
	_, srv, fl, served := serveFlaky(t, 1<<30, emfile)
	for range 3 {
		select {
		case <-fl.calls:
		case <-time.After(bound):
			t.Fatalf("Serve did not retry Accept within %v", bound)
		}
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if !errors.Is(err, remote.ErrServerClosed) {
			t.Errorf("Serve() = %v after Close, want %v", err, remote.ErrServerClosed)
		}
	case <-time.After(bound):
		t.Fatalf("Serve did not return within %v of Close", bound)
	}
}

// TestServePermanentAccept: an Accept error that is not temporary ends
// Serve with it.
func TestServePermanentAccept(t *testing.T) {
	broken := errors.New("listener broken")
	_, _, _, served := serveFlaky(t, 1, broken)
	select {
	case err := <-served:
		if !errors.Is(err, broken) {
			t.Errorf("Serve() = %v, want the Accept error %v", err, broken)
		}
	case <-time.After(bound):
		t.Fatalf("Serve did not return within %v of a permanent Accept error", bound)
	}
}

// logRecords is a slog.Handler that passes on the messages of the
// records it handles.
type logRecords chan string

func (l logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l logRecords) Handle(_ context.Context, rec slog.Record) error {
	l <- rec.Message
	return nil
}
func (l logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l logRecords) WithGroup(string) slog.Handler      { return l }

// waitLog waits for a record whose message starts with prefix, dropping
// the others.
func waitLog(t *testing.T, logs logRecords, prefix string) {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case msg := <-logs:
			if strings.HasPrefix(msg, prefix) {
				return
			}
		case <-timer.C:
			t.Fatalf("no log record %q in %v", prefix, bound)
		}
	}
}

// TestMaxConns serves at most one connection: a second client is refused
// at Dial with store.ErrUnavailable, a client's second connection fails
// its call with store.ErrTransfer, each refusal is logged, and once the
// connection served ends another client is served.
func TestMaxConns(t *testing.T) {
	g := newGate(newMemstore(t))
	path := filepath.Join(t.TempDir(), "kv.sock")
	logs := make(logRecords, 64)
	start(t, g, remote.ServerOptions{MaxConns: 1, Logger: slog.New(logs)}, path)
	a := dial(t, path, remote.ClientOptions{Conns: 2})
	ctx := context.Background()

	second, err := remote.Dial(ctx, "unix", path, remote.ClientOptions{})
	if err == nil {
		second.Close()
	}
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "MaxConns") {
		t.Errorf("Dial of a second client beyond MaxConns 1 = %v, want store.ErrUnavailable naming MaxConns", err)
	}
	waitLog(t, logs, "remote: connection refused")

	mem := host(t, 4096)
	if err := a.Register(mem.Region()); err != nil {
		t.Fatal(err)
	}
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		res := make([]store.Result, 1)
		got <- a.Get(gctx, []string{"k"}, []rdma.Region{mem.Region()}, res)
	}()
	waitClosed(t, g.entered, "the server's Get")
	res := make([]store.Result, 1)
	if err := a.Exists(ctx, []string{"k"}, res); err != nil || !errors.Is(res[0].Err, store.ErrTransfer) || !strings.Contains(res[0].Err.Error(), "MaxConns") {
		t.Errorf("Exists on a second connection beyond MaxConns 1 = %v, %+v; want store.ErrTransfer naming MaxConns", err, res[0])
	}
	waitLog(t, logs, "remote: connection refused")
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Errorf("Get canceled in the server = %v, want %v", err, context.Canceled)
	}

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitLog(t, logs, "remote: connection ended")
	b := dial(t, path, remote.ClientOptions{})
	if err := b.Exists(ctx, []string{"k"}, res); err != nil || !errors.Is(res[0].Err, store.ErrNotFound) {
		t.Errorf("Exists from a client dialed once the first was closed = %v, %+v; want store.ErrNotFound", err, res[0])
	}
}

// regWatch is a store that counts the bytes of the regions registered
// with it, and signals every change.
type regWatch struct {
	store.Store
	changed chan struct{} // one signal pending at most

	mu      sync.Mutex
	live    int // bytes registered now
	largest int // the largest region registered
}

func (w *regWatch) Register(r rdma.Region) error {
	if err := w.Store.Register(r); err != nil {
		return err
	}
	w.mu.Lock()
	w.live += r.Len
	w.largest = max(w.largest, r.Len)
	w.mu.Unlock()
	w.signal()
	return nil
}

func (w *regWatch) Unregister(r rdma.Region) error {
	if err := w.Store.Unregister(r); err != nil {
		return err
	}
	w.mu.Lock()
	w.live -= r.Len
	w.mu.Unlock()
	w.signal()
	return nil
}

func (w *regWatch) signal() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *regWatch) state() (live, largest int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.live, w.largest
}

// waitReleased waits until no region is registered with w.
func (w *regWatch) waitReleased(t *testing.T, what string) {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		if live, _ := w.state(); live == 0 {
			return
		}
		select {
		case <-w.changed:
		case <-timer.C:
			live, _ := w.state()
			t.Fatalf("%s: %d bytes of staging memory still registered after %v", what, live, bound)
		}
	}
}

// TestStagingReleased puts and gets a value of 8 MiB on a connection that
// stays open: the server's staging memory for it is registered with the
// store while the call runs, and unregistered once the connection is
// idle.
func TestStagingReleased(t *testing.T) {
	w := &regWatch{Store: newMemstoreOf(t, 32<<20), changed: make(chan struct{}, 1)}
	path := filepath.Join(t.TempDir(), "kv.sock")
	logs := make(logRecords, 64)
	start(t, w, remote.ServerOptions{Logger: slog.New(logs)}, path)
	c := dial(t, path, remote.ClientOptions{Conns: 1})
	const size = 8 << 20
	mem := host(t, 2*size)
	if err := c.Register(mem.Region()); err != nil {
		t.Fatal(err)
	}
	src, dst := sub(t, mem.Region(), 0, size), sub(t, mem.Region(), size, size)
	fill(src.Bytes(), 8)
	res := make([]store.Result, 1)
	keys := []string{"big"}
	if err := c.Put(context.Background(), keys, []rdma.Region{src}, res); err != nil || res[0].Err != nil {
		t.Fatalf("Put(big) = %v, %v", err, res[0].Err)
	}
	if _, largest := w.state(); largest < size {
		t.Fatalf("the server registered at most %d bytes of staging memory for a put of %d", largest, size)
	}
	w.waitReleased(t, "after a put of 8 MiB")
	if err := c.Get(context.Background(), keys, []rdma.Region{dst}, res); err != nil || res[0].Err != nil || res[0].N != size {
		t.Fatalf("Get(big) after the staging memory was freed = %v, %+v; want its %d bytes", err, res[0], size)
	}
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Error("Get(big): the bytes differ from the value put")
	}
	w.waitReleased(t, "after a get of 8 MiB")
	select {
	case msg := <-logs:
		t.Errorf("the server logged %q: want the connection open, and nothing logged", msg)
	default:
	}
}

// TestNewServerNil: a server of no store is refused at NewServer, with an
// error that says so, not left to fail on its first call.
func TestNewServerNil(t *testing.T) {
	srv, err := remote.NewServer(nil, remote.ServerOptions{})
	if err == nil || !strings.Contains(err.Error(), "store is nil") {
		t.Errorf("NewServer(nil) = %v, %v; want an error saying the store is nil", srv, err)
	}
}
