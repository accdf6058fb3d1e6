package storeconn_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/cudart"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// The CUDA runtime's events are what a GPU engine hands the connector as
// ready events (its copier is a *cudacopy.Copier).
var (
	_ connector.Event  = (*cudart.Event)(nil)
	_ connector.Waiter = (*cudart.Event)(nil)
)

// fakeCopier stands in for a CUDA stream: "device" memory is host memory
// that the worker may only reach through the copier.
type fakeCopier struct {
	mu      sync.Mutex
	batches int
	fail    error
}

// copy runs the copies at once; when c.fail is set it issues none and
// returns no completion, as the contract allows.
func (c *fakeCopier) copy(copies []connector.DeviceCopy) (connector.CopyCompletion, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail != nil {
		return nil, c.fail
	}
	c.batches++
	runCopies(copies)
	return copied{}, nil
}

func (c *fakeCopier) CopyToHost(copies []connector.DeviceCopy) (connector.CopyCompletion, error) {
	return c.copy(copies)
}

func (c *fakeCopier) CopyToDevice(copies []connector.DeviceCopy) (connector.CopyCompletion, error) {
	return c.copy(copies)
}

// runCopies moves the bytes of copies between "device" and host memory,
// both host memory from rdma.AllocHost in these tests.
func runCopies(copies []connector.DeviceCopy) {
	for _, cp := range copies {
		dst := rdma.Region{Addr: cp.Dst, Len: cp.N, Loc: rdma.Host}
		src := rdma.Region{Addr: cp.Src, Len: cp.N, Loc: rdma.Host}
		copy(dst.Bytes(), src.Bytes())
	}
}

// copied is the completion of copies that already ran.
type copied struct{}

func (copied) Wait(context.Context) error { return nil }

// deviceRig is a scheduler half and one worker whose KV memory (8 blocks of
// 2×2×64 bytes, in order) is "device" memory reachable only through a fake
// copier, saved and loaded over memstore.
type deviceRig struct {
	*rig
	w   connector.Worker
	cp  *fakeCopier
	mem *rdma.HostMemory
	dev rdma.Region
	kv  connector.KVCache
}

func newDeviceRig(t *testing.T, order connector.Order) *deviceRig {
	t.Helper()
	cp := &fakeCopier{}
	d := newDeviceRigOn(t, order, newMem(t), cp)
	d.cp = cp
	return d
}

// newDeviceRigOn is a deviceRig over st with copier cp.
func newDeviceRigOn(t *testing.T, order connector.Order, st store.Store, cp connector.DeviceCopier) *deviceRig {
	t.Helper()
	return newDeviceRigWith(t, order, st, cp, nil)
}

// newDeviceRigWith is a deviceRig over st with copier cp and the config
// keys of extra.
func newDeviceRigWith(t *testing.T, order connector.Order, st store.Store, cp connector.DeviceCopier, extra map[string]any) *deviceRig {
	t.Helper()
	cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"lookup": "sync"}}
	maps.Copy(cfg.Extra, extra)
	env := connector.Env{Identity: identity(1, 1), Store: st, Copier: cp}
	s, err := connector.OpenPlanner(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	w, err := connector.OpenWorker(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	kv := connector.KVCache{Layers: 2, Blocks: 8, KV: 2, BlockBytes: 64, Order: order}
	mem, err := rdma.AllocHost(kv.Blocks * kv.BlockSize())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Close()
		s.Close()
		mem.Free()
	})
	dev := mem.Region()
	dev.Loc = rdma.Device(0)
	kv.Regions = []rdma.Region{dev}
	if err := w.Register(kv); err != nil {
		t.Fatal(err)
	}
	return &deviceRig{rig: &rig{t: t, st: st, s: s, ws: []connector.Worker{w}}, w: w, mem: mem, dev: dev, kv: kv}
}

// saveFour saves the first four blocks of a 4-block prompt and waits until
// the request's blocks are released.
func (d *deviceRig) saveFour() {
	d.t.Helper()
	req := request("a", 4*bs+1)
	if err := d.s.Scheduled(req, req.Prompt, blocks(5)); err != nil {
		d.t.Fatal(err)
	}
	d.step(connector.Ready)
	if keep, _ := d.s.Finish(req, nil); keep {
		d.until("release", func(p *connector.Progress) bool { return len(p.Released) == 1 })
	}
}

// loadFour matches and starts the load of the same prompt.
func (d *deviceRig) loadFour() {
	d.t.Helper()
	req := request("b", 4*bs+1)
	m, err := d.s.Match(req, 0)
	if err != nil || m.Tokens != 4*bs {
		d.t.Fatalf("Match = %+v, %v; want %d tokens", m, err, 4*bs)
	}
	if err := d.s.Allocated(req, m.Tokens, blocks(5)); err != nil {
		d.t.Fatal(err)
	}
}

// TestDeviceStaging: KV in device memory moves through a registered host
// staging buffer, with one batch of device copies per store call, and comes
// back byte for byte.
func TestDeviceStaging(t *testing.T) {
	for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
		t.Run(order.String(), func(t *testing.T) {
			d := newDeviceRig(t, order)
			for i := range d.mem.Bytes() {
				d.mem.Bytes()[i] = byte(i * 7)
			}
			d.saveFour()
			if d.cp.batches != 1 {
				t.Errorf("saving 4 blocks took %d copy batches, want 1", d.cp.batches)
			}
			clear(d.mem.Bytes())
			d.loadFour()
			d.until("load", func(p *connector.Progress) bool { return len(p.Loaded) == 1 })
			for b := range 4 {
				for _, sp := range d.kv.Spans(nil, connector.BlockID(b)) {
					off := int(sp.Addr - d.dev.Addr)
					if !slices.Equal(d.mem.Bytes()[off:off+sp.Len], wantAt(off, sp.Len)) {
						t.Fatalf("block %d, bytes at %d differ after a round trip through device staging", b, off)
					}
				}
			}
			if st := d.w.(connector.StatsReporter).Stats(); st.StagedBytes != int64(8*d.kv.BlockSize()) {
				t.Errorf("StagedBytes = %d, want %d", st.StagedBytes, 8*d.kv.BlockSize())
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
	d := newDeviceRig(t, connector.BlockMajor)
	d.saveFour()
	d.cp.mu.Lock()
	d.cp.fail = errors.New("device lost")
	d.cp.mu.Unlock()
	d.loadFour()
	var fails []connector.LoadFailure
	d.until("load failure", func(p *connector.Progress) bool {
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

// heldCopier runs copies as they are issued, except for one batch to the
// device once armed: its copies run, and its completion completes, only
// when release is closed.
type heldCopier struct {
	mu      sync.Mutex
	armed   bool
	batch   *heldBatch
	held    chan struct{} // closed when a transfer goroutine waits for the held batch
	release chan struct{}
}

type heldBatch struct {
	c      *heldCopier
	copies []connector.DeviceCopy
	once   sync.Once
}

// arm holds the next batch to the device.
func (c *heldCopier) arm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed, c.held, c.release = true, make(chan struct{}), make(chan struct{})
}

func (c *heldCopier) CopyToHost(copies []connector.DeviceCopy) (connector.CopyCompletion, error) {
	runCopies(copies)
	return copied{}, nil
}

func (c *heldCopier) CopyToDevice(copies []connector.DeviceCopy) (connector.CopyCompletion, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.armed {
		runCopies(copies)
		return copied{}, nil
	}
	c.armed = false
	c.batch = &heldBatch{c: c, copies: slices.Clone(copies)} // the caller keeps its slice
	return c.batch, nil
}

func (b *heldBatch) Wait(ctx context.Context) error {
	b.once.Do(func() { close(b.c.held) })
	select {
	case <-b.c.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	b.c.mu.Lock()
	defer b.c.mu.Unlock()
	runCopies(b.copies)
	b.copies = nil
	return nil
}

// TestTransfersWaitOnlyForTheirCopies: each transfer goroutine of a worker
// waits for the completion of its own batch of device copies only. Two
// loads run on the worker's two transfer goroutines; while the completion
// of one's batch is held, the other's load finishes and is reported, and
// the held one is reported only after its completion is released, with
// every byte in place.
func TestTransfersWaitOnlyForTheirCopies(t *testing.T) {
	cp := &heldCopier{}
	d := newDeviceRigWith(t, connector.BlockMajor, newMem(t), cp, map[string]any{"transfer_workers": 2})
	for i := range d.mem.Bytes() {
		d.mem.Bytes()[i] = byte(i * 7)
	}
	d.saveFour()
	clear(d.mem.Bytes())

	// Two requests that share the saved prompt's first blocks: b loads four
	// blocks into blocks 0-3, c two into blocks 5 and 6. They load in one
	// step, on the worker's two transfer goroutines.
	into := map[connector.RequestID][]connector.BlockID{"b": blocks(5), "c": {5, 6, 7}}
	reqs := []*connector.Request{request("b", 4*bs+1), request("c", 2*bs+1)}
	for _, r := range reqs {
		m, err := d.s.Match(r, 0)
		if err != nil || m.Tokens != len(r.Hashes)*bs {
			t.Fatalf("Match(%s) = %+v, %v; want %d tokens", r.ID, m, err, len(r.Hashes)*bs)
		}
		if err := d.s.Allocated(r, m.Tokens, into[r.ID]); err != nil {
			t.Fatal(err)
		}
	}
	cp.arm()
	loaded := map[connector.RequestID]bool{}
	record := func(p *connector.Progress) {
		if len(p.Failed) > 0 {
			t.Fatalf("loads failed: %+v", p.Failed)
		}
		for _, id := range p.Loaded {
			loaded[id] = true
		}
	}
	record(d.step(connector.Ready)) // plans and starts both loads
	select {
	case <-cp.held:
	case <-time.After(time.Minute):
		t.Fatal("waited a minute for a transfer goroutine to wait for the held batch of device copies")
	}
	cp.mu.Lock()
	heldReq, other := connector.RequestID("b"), connector.RequestID("c")
	if dst := cp.batch.copies[0].Dst; dst >= d.dev.Addr+5*uintptr(d.kv.BlockSize()) {
		heldReq, other = other, heldReq
	}
	cp.mu.Unlock()

	d.until("the load of "+string(other)+" while the completion of "+string(heldReq)+"'s copies is held", func(p *connector.Progress) bool {
		record(p)
		return len(loaded) > 0
	})
	if loaded[heldReq] || !loaded[other] {
		t.Fatalf("loaded %v while the completion of %s's copies was held; want %s only", loaded, heldReq, other)
	}
	close(cp.release)
	d.until("the load of "+string(heldReq)+" once its completion was released", func(p *connector.Progress) bool {
		record(p)
		return len(loaded) == 2
	})
	for _, r := range reqs {
		for k := range len(r.Hashes) {
			src, dst := d.kv.Spans(nil, connector.BlockID(k)), d.kv.Spans(nil, into[r.ID][k])
			for i := range src {
				off := int(dst[i].Addr - d.dev.Addr)
				if !slices.Equal(d.mem.Bytes()[off:off+dst[i].Len], wantAt(int(src[i].Addr-d.dev.Addr), src[i].Len)) {
					t.Errorf("request %s, block %d: the bytes at %d are not those of saved block %d", r.ID, into[r.ID][k], off, k)
				}
			}
		}
	}
}
