package storeconn_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/cudart"
	"github.com/kvconnect/kvconnect/rdma"
)

// The CUDA runtime's types are what a GPU engine hands the connector.
var (
	_ connector.DeviceCopier = (*cudart.Stream)(nil)
	_ connector.Event        = (*cudart.Event)(nil)
	_ connector.Waiter       = (*cudart.Event)(nil)
)

// fakeCopier stands in for a CUDA stream: "device" memory is host memory
// that the worker may only reach through the copier.
type fakeCopier struct {
	mu      sync.Mutex
	batches int
	fail    error
}

func (c *fakeCopier) copy(copies []connector.DeviceCopy) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail != nil {
		return c.fail
	}
	c.batches++
	for _, cp := range copies {
		// Both sides are host memory from rdma.AllocHost in these tests.
		dst := rdma.Region{Addr: cp.Dst, Len: cp.N, Loc: rdma.Host}
		src := rdma.Region{Addr: cp.Src, Len: cp.N, Loc: rdma.Host}
		copy(dst.Bytes(), src.Bytes())
	}
	return nil
}

func (c *fakeCopier) CopyToHost(copies []connector.DeviceCopy) error   { return c.copy(copies) }
func (c *fakeCopier) CopyToDevice(copies []connector.DeviceCopy) error { return c.copy(copies) }
func (c *fakeCopier) Synchronize(context.Context) error                { return nil }

// TestDeviceStaging: KV in device memory moves through a registered host
// staging buffer, with one batch of device copies per store call, and comes
// back byte for byte.
func TestDeviceStaging(t *testing.T) {
	for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
		t.Run(order.String(), func(t *testing.T) {
			st := newMem(t)
			id := identity(1, 1)
			cp := &fakeCopier{}
			cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"lookup": "sync"}}
			env := connector.Env{Identity: id, Store: st, Copier: cp}
			s, err := connector.OpenScheduler(cfg, env)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			w, err := connector.OpenWorker(cfg, env)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			kv := connector.KVCache{Layers: 2, Blocks: 8, KV: 2, BlockBytes: 64, Order: order}
			mem, err := rdma.AllocHost(kv.Blocks * kv.BlockSize())
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Free()
			dev := mem.Region()
			dev.Loc = rdma.Device(0)
			kv.Regions = []rdma.Region{dev}
			if err := w.Register(kv); err != nil {
				t.Fatal(err)
			}
			for i := range mem.Bytes() {
				mem.Bytes()[i] = byte(i * 7)
			}
			want := slices.Clone(mem.Bytes()[:4*kv.BlockSize()]) // blocks 0-3 in any order
			r := &rig{t: t, st: st, s: s, ws: []connector.Worker{w}}
			req := request("a", 4*bs+1)
			if err := s.Scheduled(req, blocks(5), req.Prompt); err != nil {
				t.Fatal(err)
			}
			r.step(connector.Ready)
			if keep, _ := s.Finish(req, nil); keep {
				r.until("release", func(p *connector.Progress) bool { return len(p.Released) == 1 })
			}
			if cp.batches != 1 {
				t.Errorf("saving 4 blocks took %d copy batches, want 1", cp.batches)
			}
			clear(mem.Bytes())
			req2 := request("b", 4*bs+1)
			m, err := s.Match(req2, 0)
			if err != nil || m.Tokens != 4*bs {
				t.Fatalf("Match = %+v, %v", m, err)
			}
			if err := s.Allocated(req2, blocks(5), m.Tokens); err != nil {
				t.Fatal(err)
			}
			r.until("load", func(p *connector.Progress) bool { return len(p.Loaded) == 1 })
			got := mem.Bytes()[:4*kv.BlockSize()]
			if order == connector.LayerMajor {
				// Layer-major blocks 0-3 are spread over the region: compare
				// each span.
				for b := range 4 {
					for _, sp := range kv.Spans(nil, connector.BlockID(b)) {
						off := int(sp.Addr - dev.Addr)
						if !slices.Equal(mem.Bytes()[off:off+sp.Len], wantAt(off, sp.Len)) {
							t.Fatalf("block %d span at %d differs after the round trip", b, off)
						}
					}
				}
			} else if !slices.Equal(got, want) {
				t.Fatalf("blocks differ after a round trip through device staging")
			}
			if st := w.(connector.StatsReporter).Stats(); st.StagedBytes != int64(8*kv.BlockSize()) {
				t.Errorf("StagedBytes = %d, want %d", st.StagedBytes, 8*kv.BlockSize())
			}
		})
	}
}

func wantAt(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((off + i) * 7)
	}
	return b
}

func TestDeviceNeedsCopier(t *testing.T) {
	st := newMem(t)
	w, err := connector.OpenWorker(connector.Config{Connector: storeconn.Name}, connector.Env{Identity: identity(1, 1), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	kv := connector.KVCache{Layers: 2, Blocks: 4, KV: 2, BlockBytes: 64, Order: connector.BlockMajor,
		Regions: []rdma.Region{{Addr: 1 << 40, Len: 1024, Loc: rdma.Device(1)}}}
	if err := w.Register(kv); err == nil || !strings.Contains(err.Error(), "Env.Copier") {
		t.Errorf("Register of device memory without a copier = %v, want an error naming Env.Copier", err)
	}
}

// TestDeviceCopyFailureFailsBlocks: a failed device copy fails the
// batch's blocks instead of reporting them loaded.
func TestDeviceCopyFailureFailsBlocks(t *testing.T) {
	st := newMem(t)
	id := identity(1, 1)
	cp := &fakeCopier{}
	cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"lookup": "sync"}}
	env := connector.Env{Identity: id, Store: st, Copier: cp}
	s, _ := connector.OpenScheduler(cfg, env)
	defer s.Close()
	w, _ := connector.OpenWorker(cfg, env)
	defer w.Close()
	kv := connector.KVCache{Layers: 2, Blocks: 8, KV: 2, BlockBytes: 64, Order: connector.BlockMajor}
	mem, _ := rdma.AllocHost(kv.Blocks * kv.BlockSize())
	defer mem.Free()
	dev := mem.Region()
	dev.Loc = rdma.Device(0)
	kv.Regions = []rdma.Region{dev}
	if err := w.Register(kv); err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, st: st, s: s, ws: []connector.Worker{w}}
	req := request("a", 4*bs+1)
	s.Scheduled(req, blocks(5), req.Prompt)
	r.step(connector.Ready)
	if keep, _ := s.Finish(req, nil); keep {
		r.until("release", func(p *connector.Progress) bool { return len(p.Released) == 1 })
	}
	cp.fail = errors.New("device lost")
	req2 := request("b", 4*bs+1)
	m, _ := s.Match(req2, 0)
	if err := s.Allocated(req2, blocks(5), m.Tokens); err != nil || m.Tokens == 0 {
		t.Fatalf("Allocated(%d): %v", m.Tokens, err)
	}
	var fails []connector.LoadFailure
	r.until("load failure", func(p *connector.Progress) bool {
		if len(p.Loaded) > 0 {
			t.Fatalf("load reported done although the device copy failed")
		}
		fails = append(fails, p.Failed...)
		return len(fails) > 0
	})
	if fails[0].Valid != 0 {
		t.Errorf("Valid = %d after the first batch failed, want 0", fails[0].Valid)
	}
}
