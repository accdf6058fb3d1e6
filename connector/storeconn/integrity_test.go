package storeconn_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// hidden hides every optional interface of a store: the connector sees a
// plain store.Store and stages values with a trailer.
type hidden struct{ store.Store }

// vectored gives a plain store the gather/scatter calls, by copying
// through one buffer per key: the connector's vector path over any store.
type vectored struct{ store.Store }

var _ store.Vectored = vectored{}

func total(rs []rdma.Region) int {
	n := 0
	for _, r := range rs {
		n += r.Len
	}
	return n
}

func (v vectored) PutV(ctx context.Context, keys []string, src [][]rdma.Region, res []store.Result) error {
	if err := store.CheckBatch("putv", len(keys), len(src), len(res)); err != nil {
		return err
	}
	for i, rs := range src {
		m, err := rdma.AllocHost(max(total(rs), 1))
		if err != nil {
			return err
		}
		b := m.Bytes()[:0]
		for _, r := range rs {
			b = append(b, r.Bytes()...)
		}
		reg, _ := m.Region().Sub(0, len(b))
		err = v.Store.Put(ctx, keys[i:i+1], []rdma.Region{reg}, res[i:i+1])
		m.Free()
		if err != nil {
			return err
		}
	}
	return nil
}

func (v vectored) GetV(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result) error {
	if err := store.CheckBatch("getv", len(keys), len(dst), len(res)); err != nil {
		return err
	}
	for i, rs := range dst {
		m, err := rdma.AllocHost(max(total(rs), 1))
		if err != nil {
			return err
		}
		reg, _ := m.Region().Sub(0, total(rs))
		err = v.Store.Get(ctx, keys[i:i+1], []rdma.Region{reg}, res[i:i+1])
		if err == nil && res[i].Err == nil {
			b := m.Bytes()[:res[i].N]
			for _, r := range rs {
				b = b[copy(r.Bytes(), b):]
			}
		}
		m.Free()
		if err != nil {
			return err
		}
	}
	return nil
}

// logBuf collects log lines for assertions.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newRigLog is newRig with a logger.
func newRigLog(t *testing.T, st store.Store, id hashing.Identity, extra map[string]any, order connector.Order, log *slog.Logger) *rig {
	t.Helper()
	cfg := connector.Config{Connector: storeconn.Name, Extra: extra}
	env := connector.Env{Identity: id, Store: st, Logger: log}
	s, err := connector.OpenPlanner(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, st: st, s: s, nblocks: 32}
	w, err := connector.OpenWorker(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	kv := connector.KVCache{Layers: 2, Blocks: r.nblocks, KV: 2, BlockBytes: 64, Order: order}
	m, err := rdma.AllocHost(kv.Blocks * kv.BlockSize())
	if err != nil {
		t.Fatal(err)
	}
	kv.Regions = []rdma.Region{m.Region()}
	if err := w.Register(kv); err != nil {
		t.Fatal(err)
	}
	r.ws, r.mem, r.kv = []connector.Worker{w}, []*rdma.HostMemory{m}, []connector.KVCache{kv}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("worker Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("scheduler Close: %v", err)
		}
		m.Free()
	})
	return r
}

// fill writes a pattern that depends on seed into every block of r's KV.
func (r *rig) fill(seed byte) {
	b := r.mem[0].Bytes()
	for i := range b {
		b[i] = byte(i*13) ^ seed
	}
}

// load matches the 4-block prompt of request id and waits until its load
// ends; it returns the progress reports seen.
func (r *rig) load(id string) (loaded bool, fails []connector.LoadFailure) {
	r.t.Helper()
	req := request(id, 4*bs+1)
	m, err := r.s.Match(req, 0)
	if err != nil || m.Tokens != 4*bs {
		r.t.Fatalf("Match = %+v, %v; want %d tokens", m, err, 4*bs)
	}
	if err := r.s.Allocated(req, m.Tokens, blocks(5)); err != nil {
		r.t.Fatal(err)
	}
	r.until("the end of the load of "+id, func(p *connector.Progress) bool {
		fails = append(fails, p.Failed...)
		loaded = loaded || len(p.Loaded) > 0
		return loaded || len(fails) > 0
	})
	return loaded, fails
}

// keyOf is the store key of block i of the 4-block test prompt, shard 0.
func keyOf(t *testing.T, id hashing.Identity, i int) string {
	t.Helper()
	ns, err := id.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	return string(ns.AppendKey(nil, 0, request("x", 4*bs+1).Hashes[i]))
}

// values reads the values of the prompt's four blocks from st.
func values(t *testing.T, st store.Store, id hashing.Identity, size int) [][]byte {
	t.Helper()
	m, err := rdma.AllocHost(4 * (size + 64))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if err := st.Register(m.Region()); err != nil {
		t.Fatal(err)
	}
	defer st.Unregister(m.Region())
	var out [][]byte
	for i := range 4 {
		reg, _ := m.Region().Sub(i*(size+64), size+64)
		res := make([]store.Result, 1)
		if err := st.Get(context.Background(), []string{keyOf(t, id, i)}, []rdma.Region{reg}, res); err != nil || res[0].Err != nil {
			t.Fatalf("get block %d: %v, %v", i, err, res[0].Err)
		}
		out = append(out, bytes.Clone(reg.Bytes()[:res[0].N]))
	}
	return out
}

// putValues stores vals under the prompt's four keys in st.
func putValues(t *testing.T, st store.Store, id hashing.Identity, vals [][]byte) {
	t.Helper()
	for i, v := range vals {
		m, err := rdma.AllocHost(max(len(v), 1))
		if err != nil {
			t.Fatal(err)
		}
		copy(m.Bytes(), v)
		reg, _ := m.Region().Sub(0, len(v))
		res := make([]store.Result, 1)
		if err := st.Put(context.Background(), []string{keyOf(t, id, i)}, []rdma.Region{reg}, res); err != nil || res[0].Err != nil {
			t.Fatalf("put block %d: %v, %v", i, err, res[0].Err)
		}
		m.Free()
	}
}

// Each way the worker moves bytes, with and without verification: a
// round trip is byte-exact and the stored values have the documented size.
func TestVerifyRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		name   string
		wrap   func(store.Store) store.Store
		order  connector.Order
		verify string
	}{
		{"direct/none", func(s store.Store) store.Store { return hidden{s} }, connector.BlockMajor, "none"},
		{"staging/checksum", func(s store.Store) store.Store { return hidden{s} }, connector.BlockMajor, "checksum"},
		{"staging-layers/checksum", func(s store.Store) store.Store { return hidden{s} }, connector.LayerMajor, "checksum"},
		{"staging-layers/none", func(s store.Store) store.Store { return hidden{s} }, connector.LayerMajor, "none"},
		{"vector/checksum", func(s store.Store) store.Store { return vectored{s} }, connector.BlockMajor, "checksum"},
		{"vector-layers/checksum", func(s store.Store) store.Store { return vectored{s} }, connector.LayerMajor, "checksum"},
		{"vector/none", func(s store.Store) store.Store { return vectored{s} }, connector.BlockMajor, "none"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := newMem(t)
			st := tt.wrap(base)
			extra := map[string]any{"lookup": "sync", "verify": tt.verify}
			a := newRigLog(t, st, identity(1, 1), extra, tt.order, nil)
			a.fill(0x5a)
			a.saveAll(request("a", 4*bs+1))
			size := a.kv[0].BlockSize()
			if tt.verify == "checksum" {
				size += 24
			}
			for i, v := range values(t, base, identity(1, 1), size) {
				if len(v) != size {
					t.Fatalf("value %d is %d bytes, want %d", i, len(v), size)
				}
			}
			b := newRigLog(t, st, identity(1, 1), extra, tt.order, nil)
			loaded, fails := b.load("b")
			if !loaded || len(fails) > 0 {
				t.Fatalf("load: loaded %v, failures %+v", loaded, fails)
			}
			for blk := range 4 {
				for _, sp := range b.kv[0].Spans(nil, connector.BlockID(blk)) {
					off := int(sp.Addr - b.kv[0].Regions[0].Addr)
					if !bytes.Equal(b.mem[0].Bytes()[off:off+sp.Len], a.mem[0].Bytes()[off:off+sp.Len]) {
						t.Fatalf("block %d differs after the round trip", blk)
					}
				}
			}
			if st := b.ws[0].(connector.StatsReporter).Stats(); st.Loads != 4 || st.Corrupt != 0 {
				t.Errorf("Loads = %d, Corrupt = %d; want 4 and 0", st.Loads, st.Corrupt)
			}
		})
	}
}

// A value that is not the bytes saved under its key is a failed block,
// counted and logged, never loaded: whichever path the worker takes.
func TestVerifyRefuses(t *testing.T) {
	id := identity(1, 1)
	// The genuine values, saved once.
	src := newMem(t)
	a := newRigLog(t, hidden{src}, id, map[string]any{"lookup": "sync"}, connector.BlockMajor, nil)
	a.fill(0x33)
	a.saveAll(request("a", 4*bs+1))
	bsz := a.kv[0].BlockSize()
	good := values(t, src, id, bsz+24)

	tamper := map[string]func(i int) []byte{
		"flipped byte": func(i int) []byte {
			v := bytes.Clone(good[i])
			v[i*17%bsz] ^= 0x10
			return v
		},
		"another key's value": func(i int) []byte { return good[(i+1)%4] },
		"trailer of another key": func(i int) []byte {
			return append(bytes.Clone(good[i][:bsz]), good[(i+1)%4][bsz:]...)
		},
		"no trailer":             func(i int) []byte { return good[i][:bsz] },
		"shorter than a trailer": func(i int) []byte { return good[i][:10] },
		"truncated block":        func(i int) []byte { return append(bytes.Clone(good[i][:bsz-8]), good[i][bsz:]...) },
		"zeroed trailer": func(i int) []byte {
			v := bytes.Clone(good[i])
			clear(v[bsz:])
			return v
		},
	}
	for name, bad := range tamper {
		for _, way := range []struct {
			name string
			wrap func(store.Store) store.Store
		}{{"staging", func(s store.Store) store.Store { return hidden{s} }}, {"vector", func(s store.Store) store.Store { return vectored{s} }}} {
			t.Run(name+"/"+way.name, func(t *testing.T) {
				st := newMem(t)
				var vals [][]byte
				for i := range 4 {
					vals = append(vals, bad(i))
				}
				putValues(t, st, id, vals)
				var logs logBuf
				b := newRigLog(t, way.wrap(st), id, map[string]any{"lookup": "sync"}, connector.BlockMajor, slog.New(slog.NewTextHandler(&logs, nil)))
				b.fill(0xee)
				before := bytes.Clone(b.mem[0].Bytes())
				loaded, fails := b.load("b")
				if loaded {
					t.Fatal("tampered values were reported loaded")
				}
				if len(fails) != 1 || fails[0].Valid != 0 {
					t.Fatalf("failures = %+v, want one with 0 valid tokens", fails)
				}
				ws := b.ws[0].(connector.StatsReporter).Stats()
				if ws.Corrupt != 4 || ws.LoadFailures != 4 || ws.Loads != 0 {
					t.Errorf("Corrupt = %d, LoadFailures = %d, Loads = %d; want 4, 4, 0", ws.Corrupt, ws.LoadFailures, ws.Loads)
				}
				if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "failed verification") {
					t.Errorf("no warn line about verification in the log:\n%s", logs.String())
				}
				if way.name == "staging" && !bytes.Equal(before, b.mem[0].Bytes()) {
					t.Errorf("the staging path wrote refused bytes into KV memory")
				}
			})
		}
	}
}

// With verification off, the worker takes what the store returns: the
// contrast that shows the check above is what refuses the values.
func TestVerifyNoneTakesValues(t *testing.T) {
	id := identity(1, 1)
	st := newMem(t)
	a := newRigLog(t, st, id, map[string]any{"lookup": "sync", "verify": "none"}, connector.BlockMajor, nil)
	a.fill(0x33)
	a.saveAll(request("a", 4*bs+1))
	good := values(t, st, id, a.kv[0].BlockSize())
	other := newMem(t)
	putValues(t, other, id, [][]byte{good[1], good[2], good[3], good[0]})
	b := newRigLog(t, other, id, map[string]any{"lookup": "sync", "verify": "none"}, connector.BlockMajor, nil)
	if loaded, fails := b.load("b"); !loaded || len(fails) > 0 {
		t.Fatalf("unverified load of shuffled values: loaded %v, failures %+v; want loaded", loaded, fails)
	}
}

func TestVerifyOption(t *testing.T) {
	st := newMem(t)
	cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"verify": "crc"}}
	_, err := connector.OpenWorker(cfg, connector.Env{Identity: identity(1, 1), Store: st})
	if !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), `verify = "crc"`) {
		t.Errorf("OpenWorker(verify crc) = %v, want ErrConfig naming the value", err)
	}
}

// Generations only move forward, in the scheduler half and in workers.
func TestGenerationsMonotonic(t *testing.T) {
	st := newMem(t)
	r := newRig(t, st, identity(1, 1), nil)
	rot := r.s.(connector.Rotator)
	for _, gen := range []uint64{0} {
		if err := rot.Rotate(gen); !errors.Is(err, connector.ErrGeneration) {
			t.Errorf("Rotate(%d) at generation 0 = %v, want ErrGeneration", gen, err)
		}
	}
	if err := rot.Rotate(2); err != nil {
		t.Fatal(err)
	}
	for _, gen := range []uint64{0, 1, 2} {
		err := rot.Rotate(gen)
		if !errors.Is(err, connector.ErrGeneration) || !strings.Contains(err.Error(), fmt.Sprint(gen)) {
			t.Errorf("Rotate(%d) at generation 2 = %v, want ErrGeneration naming it", gen, err)
		}
	}
	if g := r.s.Plan().Generation; g != 2 {
		t.Errorf("generation %d after refused rotations, want 2", g)
	}
	// A worker that has run generation 2 refuses an older Metadata and
	// starts nothing of it.
	w := r.ws[0]
	if err := w.Start(context.Background(), &connector.Metadata{Step: 10, Generation: 2}); err != nil {
		t.Fatal(err)
	}
	req := request("a", 4*bs+1)
	old := &connector.Metadata{Step: 11, Generation: 1, Saves: []connector.Transfer{{ID: 99, Req: req.ID, Blocks: blocks(4), Hashes: req.Hashes}}}
	if err := w.Start(context.Background(), old); !errors.Is(err, connector.ErrGeneration) {
		t.Fatalf("Start(generation 1) after generation 2 = %v, want ErrGeneration", err)
	}
	if err := w.Save(context.Background(), connector.Ready); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background(), &connector.Metadata{Step: 12, Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if n := st.Stats().Keys; n != 0 {
		t.Errorf("the store holds %d keys after a refused Metadata, want 0", n)
	}
}

// Register after Close is refused and leaves nothing registered.
func TestRegisterAfterClose(t *testing.T) {
	st := newMem(t)
	w, err := connector.OpenWorker(connector.Config{Connector: storeconn.Name}, connector.Env{Identity: identity(1, 1), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	m, err := rdma.AllocHost(4 * 512)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	kv := connector.KVCache{Layers: 2, Blocks: 4, KV: 2, BlockBytes: 64, Order: connector.BlockMajor, Regions: []rdma.Region{m.Region()}}
	if err := w.Register(kv); !errors.Is(err, connector.ErrClosed) {
		t.Fatalf("Register after Close = %v, want ErrClosed", err)
	}
	if err := st.Register(m.Region()); err != nil {
		t.Errorf("the region stayed registered after a refused Register: %v", err)
	}
	st.Unregister(m.Region())
}
