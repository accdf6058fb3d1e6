package remote_test

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

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

// TestDialKeepsContext dials a server that takes the hello and never
// answers it: Dial returns its context's error when the context ends (its
// deadline passes, or it is canceled once the hello arrived), not
// CancelWait (an hour here) later. The bound of 5 minutes is far past
// the deadline, and far short of what a Dial that waited CancelWait
// would take.
func TestDialKeepsContext(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
	}{
		{"Deadline", context.DeadlineExceeded},
		{"Canceled", context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "mute.sock")
			l, err := remote.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			helloSeen := make(chan struct{})
			var wg sync.WaitGroup
			var conns []net.Conn
			var mu sync.Mutex
			t.Cleanup(func() {
				l.Close()
				mu.Lock()
				for _, c := range conns {
					c.Close()
				}
				mu.Unlock()
				wg.Wait()
			})
			wg.Go(func() {
				nc, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, nc)
				mu.Unlock()
				var b [1]byte
				if _, err := nc.Read(b[:]); err == nil {
					close(helloSeen)
				}
				io.Copy(io.Discard, nc) // never answers
			})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if tc.want == context.Canceled {
				ctx, cancel = context.WithCancel(context.Background())
				defer cancel()
				go func() {
					<-helloSeen
					cancel()
				}()
			}
			opts := remote.ClientOptions{Conns: 1, CallTimeout: time.Hour, CancelWait: time.Hour}
			type dialed struct {
				c   remote.Client
				err error
			}
			got := make(chan dialed, 1)
			go func() {
				c, err := remote.Dial(ctx, "unix", path, opts)
				got <- dialed{c, err}
			}()
			var d dialed
			select {
			case d = <-got:
			case <-time.After(5 * time.Minute):
				t.Fatalf("Dial had not returned 5 minutes after it began, past its context's end (2 s at most) by far: it waits for CancelWait")
			}
			if d.err == nil {
				d.c.Close()
			}
			if !errors.Is(d.err, tc.want) {
				t.Errorf("Dial of a server that never answers the hello = %v, want %v", d.err, tc.want)
			}
		})
	}
}
