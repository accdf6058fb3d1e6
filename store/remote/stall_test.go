package remote_test

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/remote"
)

// stallProxy forwards connections to a server, but passes only the first
// limit bytes of the replies on the first connection, and then holds it:
// a server that stops in the middle of a frame.
type stallProxy struct {
	path     string
	limit    int64
	stalled  chan struct{} // closed once the first connection stalls
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
	accepted int
}

func newStallProxy(t *testing.T, server string, limit int64) *stallProxy {
	t.Helper()
	p := &stallProxy{path: filepath.Join(t.TempDir(), "proxy.sock"), limit: limit, stalled: make(chan struct{})}
	l, err := remote.Listen("unix", p.path)
	if err != nil {
		t.Fatal(err)
	}
	p.wg.Go(func() {
		for {
			down, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", server)
			if err != nil {
				down.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, down, up)
			first := p.accepted == 0
			p.accepted++
			p.mu.Unlock()
			p.wg.Go(func() { io.Copy(up, down) })
			p.wg.Go(func() {
				if !first {
					io.Copy(down, up)
					return
				}
				io.CopyN(down, up, p.limit)
				close(p.stalled)
			})
		}
	})
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// helloReply is the length of a server's reply to a hello.
const helloReply = 28 + 8 + 4 + 8 + 1 + 1 + 1 + 8 + 8 + 4

// TestStalledReply gets a value through a proxy that stops the reply in
// the middle of the value: a context canceled then ends the call at once
// with the context's error for the key, and drops the connection; with no
// context to end it, CallTimeout does, with store.ErrTransfer. Later calls
// dial again and succeed: those of the same client, when its CallTimeout
// is the default; those of a client with the default, beside the one
// whose short CallTimeout ended the stall, as a fresh dial, handshake and
// 1 MiB get need not fit in that bound on a busy machine.
func TestStalledReply(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		cancel  bool
		want    error
	}{
		{"Canceled", 0, true, context.Canceled},
		// CallTimeout also bounds the dial's handshake through the proxy,
		// which cannot be tried again (the proxy stalls its first
		// connection only): 5 s leave a loaded machine room for it.
		{"CallTimeout", 5 * time.Second, false, store.ErrTransfer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := serve(t, memstore.Config{Capacity: 8 << 20}, remote.ServerOptions{}, remote.ClientOptions{})
			const size = 1 << 20
			mem := host(t, 2*size)
			if err := s.client.Register(mem.Region()); err != nil {
				t.Fatal(err)
			}
			src, dst := sub(t, mem.Region(), 0, size), sub(t, mem.Region(), size, size)
			fill(src.Bytes(), 3)
			res := make([]store.Result, 1)
			keys := []string{"stall/1"}
			if err := s.client.Put(context.Background(), keys, []rdma.Region{src}, res); err != nil || res[0].Err != nil {
				t.Fatalf("Put = %v, %v", err, res[0].Err)
			}

			p := newStallProxy(t, s.path, helloReply+size/2)
			c := dial(t, p.path, remote.ClientOptions{Conns: 1, CallTimeout: tc.timeout})
			if err := c.Register(mem.Region()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Get(ctx, keys, []rdma.Region{dst}, res) }()
			waitClosed(t, p.stalled, "the proxy's stall half way through the value")
			if tc.cancel {
				cancel()
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(bound):
				t.Fatalf("Get through a stalled reply did not return in %v", bound)
			}
			if err != nil || !errors.Is(res[0].Err, tc.want) || res[0].N != 0 {
				t.Fatalf("Get through a stalled reply = %v, %+v; want a per-key error matching %v", err, res[0], tc.want)
			}
			if tc.want == store.ErrTransfer && !strings.Contains(res[0].Err.Error(), "timeout") {
				t.Errorf("Get through a stalled reply: %v, want it to say the call timed out", res[0].Err)
			}
			clear(dst.Bytes())
			again := c
			if tc.timeout != 0 {
				again = dial(t, p.path, remote.ClientOptions{Conns: 1})
				if err := again.Register(mem.Region()); err != nil {
					t.Fatal(err)
				}
			}
			if err := again.Get(context.Background(), keys, []rdma.Region{dst}, res); err != nil || res[0].Err != nil || res[0].N != size {
				t.Fatalf("Get after the stalled one = %v, %+v; want the value, on a new connection", err, res[0])
			}
			if string(dst.Bytes()) != string(src.Bytes()) {
				t.Error("Get after the stalled one: the bytes differ from the value put")
			}
		})
	}
}
