//go:build unix

package p2p_test

import (
	"bytes"
	"errors"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/p2p"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/shm"
)

// instance is one engine instance whose halves were opened by name, with
// the transfer engines the workers opened themselves.
type instance struct {
	sched   connector.Planner
	workers []connector.Worker
	kv      []connector.KVCache
	free    []func() error
	closed  bool
}

// openInstance opens an instance of role by name, its workers opening
// transfer engines of kind ("transfer"), and registers each worker's KV
// memory: from the worker's shm engine for "shm", else host memory.
func openInstance(t *testing.T, id hashing.Identity, role connector.Role, engineID, kind string) *instance {
	t.Helper()
	return openInstanceExtra(t, id, role, engineID, map[string]any{"transfer": kind})
}

// openInstanceExtra is openInstance with the whole
// kv_connector_extra_config, whose "transfer" gives the kind.
func openInstanceExtra(t *testing.T, id hashing.Identity, role connector.Role, engineID string, extra map[string]any) *instance {
	t.Helper()
	kind, _ := extra["transfer"].(string)
	cfg := connector.Config{Connector: p2p.Name, Role: role, EngineID: engineID, Extra: extra}
	s, err := connector.OpenPlanner(cfg, connector.Env{Identity: id})
	if err != nil {
		t.Fatalf("OpenPlanner(%s): %v", engineID, err)
	}
	in := &instance{sched: s}
	t.Cleanup(func() { in.close(t, engineID) })
	for rank := range id.Layout.TPSize {
		w, err := connector.OpenWorker(cfg, connector.Env{Identity: id, Rank: rank})
		if err != nil {
			t.Fatalf("OpenWorker(%s, rank %d): %v", engineID, rank, err)
		}
		in.workers = append(in.workers, w)
		kv := connector.KVCache{Layers: 2, Blocks: 16, KV: 2, BlockBytes: 64, Order: connector.BlockMajor}
		n := kv.Layers * kv.KV * kv.Blocks * kv.BlockBytes
		var region rdma.Region
		if kind == p2p.TransferShm {
			m, err := w.(*p2p.Worker).Engine().(*shm.Engine).Alloc(n)
			if err != nil {
				t.Fatalf("shm Alloc: %v", err)
			}
			in.free = append(in.free, m.Free)
			region = m.Region()
		} else {
			m, err := rdma.AllocHost(n)
			if err != nil {
				t.Fatalf("AllocHost: %v", err)
			}
			in.free = append(in.free, m.Free)
			region = m.Region()
		}
		kv.Regions = []rdma.Region{region}
		if err := w.Register(kv); err != nil {
			t.Fatalf("%s: worker %d: Register: %v", engineID, rank, err)
		}
		in.kv = append(in.kv, kv)
	}
	return in
}

// close closes in's halves and frees its KV memory, once.
func (in *instance) close(t *testing.T, engineID string) {
	t.Helper()
	if in.closed {
		return
	}
	in.closed = true
	for i, w := range in.workers {
		if err := w.Close(); err != nil {
			t.Errorf("%s: worker %d: Close: %v", engineID, i, err)
		}
	}
	if err := in.sched.Close(); err != nil {
		t.Errorf("%s: scheduler Close: %v", engineID, err)
	}
	for _, f := range in.free {
		if err := f(); err != nil {
			t.Errorf("%s: free: %v", engineID, err)
		}
	}
}

// step runs one engine step of in and returns its progress.
func (in *instance) step(t *testing.T) *connector.Progress {
	t.Helper()
	m := in.sched.Plan()
	outs := make([]*connector.Output, len(in.workers))
	for i, w := range in.workers {
		if err := w.Start(t.Context(), m); err != nil {
			t.Fatalf("worker %d: Start: %v", i, err)
		}
		if err := w.Save(t.Context(), connector.Ready); err != nil {
			t.Fatalf("worker %d: Save: %v", i, err)
		}
		outs[i] = w.Poll()
	}
	p, err := in.sched.Update(outs)
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	return p
}

// until steps in until cond holds for a step's progress, failing after a
// bound with what it waited for.
func (in *instance) until(t *testing.T, what string, cond func(*connector.Progress) bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond(in.step(t)) {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		runtime.Gosched()
	}
}

func (in *instance) block(rank int, b connector.BlockID) []byte {
	var out []byte
	for _, sp := range in.kv[rank].Spans(nil, b) {
		out = append(out, sp.Bytes()...)
	}
	return out
}

// TestOpenedByName: a producer and a consumer, each opened by name with
// its own transfer engines opened from the config ("transfer"), sharing
// nothing but the transfer parameters' bytes: the consumer loads the
// producer's blocks byte for byte into other block ids, and the producer
// releases them once it is told.
func TestOpenedByName(t *testing.T) {
	kinds := []string{p2p.TransferLoopback}
	if runtime.GOOS == "linux" {
		kinds = append(kinds, p2p.TransferShm)
	}
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			id := hashing.Identity{
				Tenant: "acme", Model: "m", WeightsVersion: "v1",
				Format: hashing.Format{Device: "cpu", ModelDType: "bf16", KVDType: "bf16"},
				Layout: hashing.Layout{Layers: 2, KVHeads: 4, HeadDim: 8, BlockSize: 4, TPSize: 2, Replication: 1},
			}
			prod := openInstance(t, id, connector.RoleProducer, "byname-prefill-"+kind, kind)
			cons := openInstance(t, id, connector.RoleConsumer, "byname-decode-"+kind, kind)

			tokens := make([]hashing.Token, 6*4)
			for i := range tokens {
				tokens[i] = hashing.Token(1000 + 3*i)
			}
			pblocks := []connector.BlockID{3, 4, 5, 6, 7, 8}
			params := prefill(t, prod, tokens, pblocks)
			hashes, err := hashing.HashBlocks(4, tokens)
			if err != nil {
				t.Fatal(err)
			}

			creq := &connector.Request{ID: "r", Prompt: len(tokens), Hashes: hashes, TransferParams: slices.Clone(params)}
			m, err := cons.sched.Match(creq, 0)
			if err != nil || m.Tokens != 5*4 {
				t.Fatalf("consumer Match = %+v, %v; want 20 tokens", m, err)
			}
			cblocks := []connector.BlockID{10, 11, 12, 13, 14, 15}
			if err := cons.sched.Allocated(creq, m.Tokens, cblocks); err != nil {
				t.Fatal(err)
			}
			cons.until(t, "the consumer's load", func(p *connector.Progress) bool {
				if len(p.Failed) > 0 {
					t.Fatalf("load failed: %+v", p.Failed)
				}
				return slices.Contains(p.Loaded, "r")
			})
			for rank := range cons.kv {
				for i := range 5 {
					if got, want := cons.block(rank, cblocks[i]), prod.block(rank, pblocks[i]); !bytes.Equal(got, want) {
						t.Errorf("rank %d: consumer block %d differs from the producer's block %d", rank, cblocks[i], pblocks[i])
					}
				}
				if !bytes.Equal(cons.block(rank, cblocks[5]), make([]byte, len(cons.block(rank, cblocks[5])))) {
					t.Errorf("rank %d: the block with the last prompt token was written", rank)
				}
			}
			if keep, err := cons.sched.Finish(creq, cblocks); err != nil || keep {
				t.Fatalf("consumer Finish = %v, %v; want false", keep, err)
			}
			prod.until(t, "the producer to release the blocks its consumer is done with", func(p *connector.Progress) bool {
				return slices.Contains(p.Released, "r")
			})
		})
	}
}

// TestTransferMisuse: a transfer engine given twice, or one the connector
// does not know, is an error naming the key and the value.
func TestTransferMisuse(t *testing.T) {
	id := hashing.Identity{
		Tenant: "acme", Model: "m", WeightsVersion: "v1",
		Format: hashing.Format{Device: "cpu", ModelDType: "bf16", KVDType: "bf16"},
		Layout: hashing.Layout{Layers: 2, KVHeads: 4, HeadDim: 8, BlockSize: 4, TPSize: 1, Replication: 1},
	}
	f := rdma.NewFabric()
	e, err := f.NewEngine("transfer-misuse", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cfg := connector.Config{Connector: p2p.Name, Role: connector.RoleConsumer, EngineID: "transfer-misuse", Extra: map[string]any{"transfer": "loopback"}}
	s, err := connector.OpenPlanner(cfg, connector.Env{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name string
		err  func() error
		want string
	}{
		{"unknown transfer", func() error {
			bad := cfg
			bad.Extra = map[string]any{"transfer": "carrier-pigeon"}
			_, err := connector.OpenWorker(bad, connector.Env{Identity: id})
			return err
		}, `kv_connector_extra_config.transfer = "carrier-pigeon"`},
		{"engine twice", func() error {
			_, err := connector.OpenWorker(cfg, connector.Env{Identity: id, Engine: e})
			return err
		}, `Env.Engine is set and kv_connector_extra_config.transfer = "loopback"`},
		{"New with transfer", func() error {
			_, _, err := p2p.New(cfg, connector.Env{Identity: id}, e)
			return err
		}, `transfer = "loopback": New takes its transfer engines as arguments`},
	} {
		err := tc.err()
		if !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrConfig containing %q", tc.name, err, tc.want)
		}
	}
}

// TestMailboxSlotsMismatch: a worker whose mailbox_slots differs from its
// scheduler half's is refused when it registers, naming the setting,
// rather than arming every offer in a slot its parameters do not name.
func TestMailboxSlotsMismatch(t *testing.T) {
	id := hashing.Identity{
		Tenant: "acme", Model: "m", WeightsVersion: "v1",
		Format: hashing.Format{Device: "cpu", ModelDType: "bf16", KVDType: "bf16"},
		Layout: hashing.Layout{Layers: 2, KVHeads: 4, HeadDim: 8, BlockSize: 4, TPSize: 1, Replication: 1},
	}
	cfg := connector.Config{Connector: p2p.Name, Role: connector.RoleProducer, EngineID: "slots", Extra: map[string]any{"transfer": p2p.TransferLoopback, "mailbox_slots": 1}}
	s, err := connector.OpenPlanner(cfg, connector.Env{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cfg.Extra = map[string]any{"transfer": p2p.TransferLoopback, "mailbox_slots": 2}
	w, err := connector.OpenWorker(cfg, connector.Env{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	m, err := rdma.AllocHost(2 * 16 * 2 * 64)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	kv := connector.KVCache{Layers: 2, Blocks: 16, KV: 2, BlockBytes: 64, Order: connector.BlockMajor, Regions: []rdma.Region{m.Region()}}
	if err := w.Register(kv); !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), "mailbox_slots") {
		t.Fatalf("Register with mailbox_slots 2 under a scheduler half with 1 = %v, want an error wrapping ErrConfig naming mailbox_slots", err)
	}
}

// kvByte is byte j of span s of the i-th block of the prompt on rank: the
// producer writes it, the consumer checks it.
func kvByte(rank, i, s, j int) byte { return byte(rank*131 + i*17 + s*7 + j) }

// prefill has producer prod compute the prompt's blocks into pblocks
// (with kvByte), finish the request "r" keeping them, and returns its
// transfer parameters.
func prefill(t *testing.T, prod *instance, tokens []hashing.Token, pblocks []connector.BlockID) []byte {
	t.Helper()
	hashes, err := hashing.HashBlocks(4, tokens)
	if err != nil {
		t.Fatal(err)
	}
	req := &connector.Request{ID: "r", Prompt: len(tokens), Hashes: hashes}
	if m, err := prod.sched.Match(req, 0); err != nil || m.Tokens != 0 {
		t.Fatalf("producer Match = %+v, %v", m, err)
	}
	if err := prod.sched.Allocated(req, 0, pblocks); err != nil {
		t.Fatal(err)
	}
	if err := prod.sched.Scheduled(req, len(tokens), pblocks); err != nil {
		t.Fatal(err)
	}
	for rank := range prod.kv {
		for i, b := range pblocks {
			for s, sp := range prod.kv[rank].Spans(nil, b) {
				for j := range sp.Bytes() {
					sp.Bytes()[j] = kvByte(rank, i, s, j)
				}
			}
		}
	}
	prod.step(t)
	keep, err := prod.sched.Finish(req, pblocks)
	if err != nil || !keep {
		t.Fatalf("producer Finish = %v, %v; want true", keep, err)
	}
	params, err := prod.sched.(connector.TransferParamsSource).TransferParams("r")
	if err != nil {
		t.Fatal(err)
	}
	return params
}
