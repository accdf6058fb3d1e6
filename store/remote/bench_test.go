package remote_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/remote"
)

const (
	benchKeys  = 16
	benchValue = 256 << 10
	benchSets  = 64 // key sets a put cycles through: four times what the store holds
)

// benchRig is a memstore, a client of it served over a unix socket, and
// registered memory of one batch of sources and one of destinations.
type benchRig struct {
	direct   *memstore.Store
	client   remote.Client
	src, dst []rdma.Region
	sets     [][]string
	res      []store.Result
}

func newBenchRig(b *testing.B) *benchRig {
	inner, err := memstore.New(memstore.Config{Capacity: benchSets / 4 * benchKeys * benchValue})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { inner.Close() })
	path := filepath.Join(b.TempDir(), "kv.sock")
	start(b, inner, remote.ServerOptions{}, path)
	c := dial(b, path, remote.ClientOptions{})
	mem := host(b, 2*benchKeys*benchValue)
	if err := c.Register(mem.Region()); err != nil {
		b.Fatal(err)
	}
	r := &benchRig{direct: inner, client: c, res: make([]store.Result, benchKeys)}
	for i := range benchKeys {
		r.src = append(r.src, sub(b, mem.Region(), i*benchValue, benchValue))
		r.dst = append(r.dst, sub(b, mem.Region(), (benchKeys+i)*benchValue, benchValue))
		fill(r.src[i].Bytes(), i)
	}
	for s := range benchSets {
		keys := make([]string, benchKeys)
		for i := range keys {
			keys[i] = fmt.Sprintf("bench/%02d/%02d", s, i)
		}
		r.sets = append(r.sets, keys)
	}
	return r
}

func (r *benchRig) check(b *testing.B, err error) {
	if err != nil {
		b.Fatal(err)
	}
	for _, x := range r.res {
		if x.Err != nil {
			b.Fatal(x.Err)
		}
	}
}

// bench runs "direct" (the memstore called in process) and "remote" (the
// same store through a client and a server over a unix socket) of op, and
// reports the remote batch's time as a multiple of the direct one's
// (x-direct), and both in GB/s.
func bench(b *testing.B, op func(r *benchRig, s store.Store, i int) error) {
	r := newBenchRig(b)
	var directNs float64
	for _, which := range []string{"direct", "remote"} {
		b.Run(fmt.Sprintf("%s/%dx%dKiB", which, benchKeys, benchValue>>10), func(b *testing.B) {
			var s store.Store = r.direct
			if which == "remote" {
				s = r.client
			}
			b.SetBytes(benchKeys * benchValue)
			i := 0
			for b.Loop() {
				r.check(b, op(r, s, i))
				i++
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(benchKeys*benchValue/ns, "GB/s")
			if which == "direct" {
				directNs = ns
			} else if directNs > 0 {
				b.ReportMetric(ns/directNs, "x-direct")
			}
		})
	}
}

// BenchmarkRemoteGet measures a get of 16 values of 256 KiB, present in
// the store.
func BenchmarkRemoteGet(b *testing.B) {
	bench(b, func(r *benchRig, s store.Store, i int) error {
		if i == 0 {
			if err := s.Put(context.Background(), r.sets[0], r.src, r.res); err != nil {
				return err
			}
		}
		return s.Get(context.Background(), r.sets[0], r.dst, r.res)
	})
}

// BenchmarkRemotePut measures a put of 16 values of 256 KiB under new
// keys, into a full store (each put evicts older values).
func BenchmarkRemotePut(b *testing.B) {
	bench(b, func(r *benchRig, s store.Store, i int) error {
		return s.Put(context.Background(), r.sets[i%benchSets], r.src, r.res)
	})
}

// BenchmarkHello dials a server over a unix socket, a connection and its
// handshake, with a shared secret and without, alternately in the same
// loop, and reports each one's time and their ratio: what the mutual
// proof of the secret (two HMAC-SHA256 on each side, and a second round
// trip) adds to a connection's start.
func BenchmarkHello(b *testing.B) {
	dir := b.TempDir()
	plain, secret := filepath.Join(dir, "plain.sock"), filepath.Join(dir, "secret.sock")
	key := remote.Secret("a shared secret of thirty bytes")
	start(b, newMemstore(b), remote.ServerOptions{}, plain)
	start(b, newMemstore(b), remote.ServerOptions{Secret: key}, secret)
	ctx := context.Background()
	var tPlain, tSecret time.Duration
	for b.Loop() {
		t0 := time.Now()
		c, err := remote.Dial(ctx, "unix", plain, remote.ClientOptions{Conns: 1})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		c.Close()
		t2 := time.Now()
		s, err := remote.Dial(ctx, "unix", secret, remote.ClientOptions{Conns: 1, Secret: key})
		if err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		s.Close()
		tPlain += t1.Sub(t0)
		tSecret += t3.Sub(t2)
	}
	b.ReportMetric(float64(tPlain.Nanoseconds())/float64(b.N), "ns/hello-plain")
	b.ReportMetric(float64(tSecret.Nanoseconds())/float64(b.N), "ns/hello-secret")
	b.ReportMetric(float64(tSecret)/float64(tPlain), "secret/plain")
}
