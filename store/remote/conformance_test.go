package remote_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/remote"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// served is a memstore served over a unix socket, and a client of it.
type served struct {
	inner  *memstore.Store
	srv    *remote.Server
	client remote.Client
	path   string
}

// serve starts a server of a new memstore on a socket in a new temporary
// directory and dials it; everything is closed when t ends.
func serve(t testing.TB, cfg memstore.Config, sopts remote.ServerOptions, copts remote.ClientOptions) *served {
	t.Helper()
	inner, err := memstore.New(cfg)
	if err != nil {
		t.Fatalf("memstore.New(%+v) = %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := inner.Close(); err != nil {
			t.Errorf("memstore Close() = %v", err)
		}
	})
	s := &served{inner: inner, path: filepath.Join(t.TempDir(), "kv.sock")}
	s.srv = start(t, inner, sopts, s.path)
	c, err := remote.Dial(context.Background(), "unix", s.path, copts)
	if err != nil {
		t.Fatalf("Dial(unix, %s) = %v", s.path, err)
	}
	s.client = c
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("client Close() = %v", err)
		}
	})
	return s
}

// start serves inner on a unix socket at path until t ends.
func start(t testing.TB, inner store.Store, opts remote.ServerOptions, path string) *remote.Server {
	t.Helper()
	srv, err := remote.NewServer(inner, opts)
	if err != nil {
		t.Fatalf("NewServer(%+v) = %v", opts, err)
	}
	l, err := remote.Listen("unix", path)
	if err != nil {
		t.Fatalf("Listen(unix, %s) = %v", path, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(l); !errors.Is(err, remote.ErrServerClosed) {
			t.Errorf("Serve() = %v, want %v", err, remote.ErrServerClosed)
		}
	})
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("server Close() = %v", err)
		}
		wg.Wait()
	})
	return srv
}

// TestConformance runs the store conformance harness over clients of
// memstores served over unix sockets, in the shapes memstore's own
// conformance test uses. A client takes only registered memory whatever
// the served store does, so every shape declares Registration.
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  memstore.Config
		opts storetest.Options
	}{
		{"Large", memstore.Config{Capacity: 32 << 20, Shards: 8}, storetest.Options{Capacity: 32 << 20, Stats: true, Registration: true, Counters: storetest.AllCounters}},
		{"Evicting", memstore.Config{Capacity: 64 << 10, Shards: 4}, storetest.Options{Evicts: true, Capacity: 64 << 10, Stats: true, Registration: true, Counters: storetest.AllCounters}},
		{"RequireRegistered", memstore.Config{Capacity: 8 << 20, RequireRegistered: true}, storetest.Options{Capacity: 8 << 20, Stats: true, Registration: true, Counters: storetest.AllCounters}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // the shapes share nothing: a run takes the longest, not the sum
			storetest.Run(t, func(t testing.TB) store.Store {
				return serve(t, tc.cfg, remote.ServerOptions{}, remote.ClientOptions{}).client
			}, tc.opts)
		})
	}
	// Over TCP, with a shared secret on both sides.
	t.Run("TCP", func(t *testing.T) {
		t.Parallel()
		secret := remote.Secret("the conformance test's shared secret")
		storetest.Run(t, func(t testing.TB) store.Store {
			inner := newMemstoreOf(t, 8<<20)
			srv, err := remote.NewServer(inner, remote.ServerOptions{Secret: secret})
			if err != nil {
				t.Fatal(err)
			}
			l, err := remote.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			wg.Go(func() {
				if err := srv.Serve(l); !errors.Is(err, remote.ErrServerClosed) {
					t.Errorf("Serve() = %v, want %v", err, remote.ErrServerClosed)
				}
			})
			t.Cleanup(func() {
				if err := srv.Close(); err != nil {
					t.Errorf("server Close() = %v", err)
				}
				wg.Wait()
			})
			c, err := remote.Dial(context.Background(), "tcp", l.Addr().String(), remote.ClientOptions{Secret: secret})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}, storetest.Options{Capacity: 1 << 20, Stats: true, Registration: true, Counters: storetest.AllCounters})
	})
}
