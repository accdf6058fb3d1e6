package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/mooncake"
	"github.com/kvconnect/kvconnect/store/remote"
)

// Stores are the values of -store.
var Stores = []string{"memstore", "remote", "mooncake"}

// valueBytes returns the bytes memstore takes for one block's value: the
// block and the connector's 24-byte trailer, in 64-byte units.
func valueBytes(bs, bpt int) int64 {
	return (int64(bs*bpt) + 24 + 63) &^ 63
}

// memCapacity returns the memstore capacity in bytes that holds exactly
// tokens tokens of KV (whole blocks) below its eviction watermark: the
// block after them evicts.
func memCapacity(tokens int64, bs, bpt int) int64 {
	blocks := (tokens + int64(bs) - 1) / int64(bs)
	units := blocks * valueBytes(bs, bpt) / 64
	c := (int64(float64(units)/memstore.DefaultHighWatermark) + 2) * 64
	return max(c, memstore.MinCapacity)
}

// openedStore is a store a replay runs over, and how to close what it
// opened.
type openedStore struct {
	st    store.Store // what the engines use: timed
	inner store.Store // the store itself (the memstore, also when served)
	timed *timed
	close func() error
}

// openStore opens the store kind of -store with room for capacity tokens
// (0: every key of the trace, keys of them).
func openStore(ctx context.Context, kind string, capacity, keys int64, bs, bpt int, mooncakeConfig string) (*openedStore, error) {
	if capacity == 0 { // every key of the trace, and a quarter more: no eviction
		capacity = keys*int64(bs) + keys*int64(bs)/4
	}
	switch kind {
	case "memstore":
		m, err := memstore.New(memstore.Config{Capacity: memCapacity(capacity, bs, bpt)})
		if err != nil {
			return nil, err
		}
		t := newTimed(m)
		return &openedStore{st: t.store(), inner: m, timed: t, close: m.Close}, nil
	case "remote":
		m, err := memstore.New(memstore.Config{Capacity: memCapacity(capacity, bs, bpt)})
		if err != nil {
			return nil, err
		}
		return serveRemote(ctx, m)
	case "mooncake":
		var cfg mooncake.Config
		var err error
		if mooncakeConfig != "" {
			cfg, err = mooncake.LoadConfig(mooncakeConfig)
		} else {
			cfg, err = mooncake.ConfigFromEnv()
		}
		if err != nil {
			return nil, fmt.Errorf("-store mooncake: %w", err)
		}
		s, err := mooncake.Open(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("-store mooncake: %w", err)
		}
		t := newTimed(s)
		return &openedStore{st: t.store(), inner: s, timed: t, close: s.Close}, nil
	}
	return nil, fmt.Errorf("-store = %q, want one of %q", kind, Stores)
}

// serveRemote serves m with store/remote on a unix socket of a fresh
// directory, and returns a client of it: the engines' calls cross the
// wire, framed and checked, as from another process.
func serveRemote(ctx context.Context, m *memstore.Store) (*openedStore, error) {
	dir, err := os.MkdirTemp("", "tracereplay-")
	if err != nil {
		m.Close()
		return nil, err
	}
	sock := filepath.Join(dir, "store.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		m.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	srv, err := remote.NewServer(m, remote.ServerOptions{})
	if err != nil {
		ln.Close()
		m.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	stop := func() error {
		err := srv.Close()
		if serr := <-served; !errors.Is(serr, remote.ErrServerClosed) {
			err = errors.Join(err, fmt.Errorf("the store's server: %w", serr))
		}
		return errors.Join(err, m.Close(), os.RemoveAll(dir))
	}
	c, err := remote.Dial(ctx, "unix", sock, remote.ClientOptions{})
	if err != nil {
		return nil, errors.Join(err, stop())
	}
	t := newTimed(c)
	return &openedStore{st: t.store(), inner: m, timed: t, close: func() error { return errors.Join(c.Close(), stop()) }}, nil
}

// timed counts and times a store's exists and put calls. Its store method
// returns it with the optional interfaces of the store it wraps that the
// connector uses (store.Vectored, store.Leaser), so that wrapping changes
// no path.
type timed struct {
	store.Store
	mu      sync.Mutex
	exists  []time.Duration // one per call
	keys    int64           // keys of the exists calls
	puts    int64
	putKeys int64
	putTime time.Duration
}

func newTimed(s store.Store) *timed { return &timed{Store: s} }

func (t *timed) Exists(ctx context.Context, keys []string, res []store.Result) error {
	start := time.Now()
	err := t.Store.Exists(ctx, keys, res)
	d := time.Since(start)
	t.mu.Lock()
	t.exists = append(t.exists, d)
	t.keys += int64(len(keys))
	t.mu.Unlock()
	return err
}

func (t *timed) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	start := time.Now()
	err := t.Store.Put(ctx, keys, src, res)
	t.put(len(keys), time.Since(start))
	return err
}

func (t *timed) put(n int, d time.Duration) {
	t.mu.Lock()
	t.puts++
	t.putKeys += int64(n)
	t.putTime += d
	t.mu.Unlock()
}

// lookups returns the exists calls' count, keys, time in calls and
// latency percentiles, and clears them.
func (t *timed) lookups() (calls, keys int64, total, p50, p99 time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.exists) == 0 {
		return 0, 0, 0, 0, 0
	}
	for _, d := range t.exists {
		total += d
	}
	slices.Sort(t.exists)
	calls, keys = int64(len(t.exists)), t.keys
	p50, p99 = pct(t.exists, 0.5), pct(t.exists, 0.99)
	t.exists, t.keys = t.exists[:0], 0
	return calls, keys, total, p50, p99
}

type vectored interface {
	store.Store
	store.Vectored
}

// timedV is a timed store.Vectored.
type timedV struct {
	*timed
	v store.Vectored
}

func (t timedV) PutV(ctx context.Context, keys []string, src [][]rdma.Region, res []store.Result) error {
	start := time.Now()
	err := t.v.PutV(ctx, keys, src, res)
	t.put(len(keys), time.Since(start))
	return err
}

func (t timedV) GetV(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result) error {
	return t.v.GetV(ctx, keys, dst, res)
}

// timedVL is a timed store.Vectored and store.Leaser.
type timedVL struct {
	timedV
	l store.Leaser
}

func (t timedVL) Leases() store.Leases { return t.l.Leases() }

// timedL is a timed store.Leaser.
type timedL struct {
	*timed
	l store.Leaser
}

func (t timedL) Leases() store.Leases { return t.l.Leases() }

// store returns t with the optional interfaces of the wrapped store.
func (t *timed) store() store.Store {
	v, isV := t.Store.(store.Vectored)
	l, isL := t.Store.(store.Leaser)
	switch {
	case isV && isL:
		return timedVL{timedV{t, v}, l}
	case isV:
		return timedV{t, v}
	case isL:
		return timedL{t, l}
	}
	return t
}
