package remote_test

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/remote"
)

// presenceOnly is a store whose Exists reports presence only, N 0 for a
// present key, as store/mooncake does with PresenceOnly.
type presenceOnly struct{ store.Store }

func (p presenceOnly) Exists(ctx context.Context, keys []string, res []store.Result) error {
	err := p.Store.Exists(ctx, keys, res)
	for i := range res {
		if res[i].Err == nil {
			res[i].N = 0
		}
	}
	return err
}

// TestExistsPresenceOnly serves a store that reports presence only: the
// client's Exists reports a present key with N 0, and the connection
// stays in use.
func TestExistsPresenceOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.sock")
	start(t, presenceOnly{newMemstore(t)}, remote.ServerOptions{}, path)
	c := dial(t, path, remote.ClientOptions{Conns: 1})
	mem := host(t, 8192)
	if err := c.Register(mem.Region()); err != nil {
		t.Fatal(err)
	}
	src, dst := sub(t, mem.Region(), 0, 4096), sub(t, mem.Region(), 4096, 4096)
	fill(src.Bytes(), 1)
	res := make([]store.Result, 2)
	if err := c.Put(context.Background(), []string{"here"}, []rdma.Region{src}, res[:1]); err != nil || res[0].Err != nil {
		t.Fatalf("Put(here) = %v, %v", err, res[0].Err)
	}
	for round := range 2 {
		if err := c.Exists(context.Background(), []string{"here", "gone"}, res); err != nil {
			t.Fatalf("round %d: Exists(here, gone) = %v, want per-key results", round, err)
		}
		if res[0].Err != nil || res[0].N != 0 {
			t.Errorf("round %d: Exists(here) from a presence-only store = %+v, want present with N 0", round, res[0])
		}
		if !errors.Is(res[1].Err, store.ErrNotFound) {
			t.Errorf("round %d: Exists(gone) = %+v, want store.ErrNotFound", round, res[1])
		}
	}
	if err := c.Get(context.Background(), []string{"here"}, []rdma.Region{dst}, res[:1]); err != nil || res[0].Err != nil || res[0].N != src.Len {
		t.Errorf("Get(here) after Exists = %v, %+v; want its %d bytes", err, res[0], src.Len)
	}
}

// TestDialCanceledDuringHello ends Dial's context while the hello waits
// for its reply, through a proxy that passes the reply on only once the
// client's cancel of the hello reached the server: the handshake
// completes, and the first call is served, not taken for the hello.
func TestDialCanceledDuringHello(t *testing.T) {
	dir := t.TempDir()
	path, proxy := filepath.Join(dir, "kv.sock"), filepath.Join(dir, "proxy.sock")
	start(t, newMemstore(t), remote.ServerOptions{}, path)
	pl, err := remote.Listen("unix", proxy)
	if err != nil {
		t.Fatal(err)
	}
	const frameLen = 28 + 4 // a hello and a cancel: a header and a trailer
	helloSeen := make(chan struct{})
	var conns []net.Conn
	var mu sync.Mutex
	var wg sync.WaitGroup
	t.Cleanup(func() {
		pl.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		down, err := pl.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("unix", path)
		if err != nil {
			down.Close()
			return
		}
		mu.Lock()
		conns = append(conns, down, up)
		mu.Unlock()
		if _, err := io.CopyN(up, down, frameLen); err != nil {
			return
		}
		close(helloSeen)
		if _, err := io.CopyN(up, down, frameLen); err != nil {
			return
		}
		wg.Go(func() { io.Copy(up, down) })
		io.Copy(down, up)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-helloSeen
		cancel()
	}()
	c, err := remote.Dial(ctx, "unix", proxy, remote.ClientOptions{Conns: 1})
	if err != nil {
		t.Fatalf("Dial with its context ended after the hello was sent = %v, want the handshake done", err)
	}
	defer c.Close()
	res := make([]store.Result, 1)
	if err := c.Exists(context.Background(), []string{"first"}, res); err != nil || !errors.Is(res[0].Err, store.ErrNotFound) {
		t.Errorf("the first Exists after the hello's cancel = %v, %+v; want store.ErrNotFound", err, res[0])
	}
}
