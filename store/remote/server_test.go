package remote_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

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
