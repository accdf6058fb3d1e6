package storeconn_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
)

// TestOptionBounds: every count and duration of kv_connector_extra_config
// has an upper bound as well as a lower one, and a value outside is an
// error naming the key, the value and the bounds (1e9 lookup workers
// would otherwise start 1e9 goroutines).
func TestOptionBounds(t *testing.T) {
	st := newMem(t)
	for _, tc := range []struct {
		name  string
		key   string
		value any
		want  string
	}{
		{"lookup_workers 1e9", "lookup_workers", 1e9, "lookup_workers = 1000000000, want 1 to 256"},
		{"lookup_queue 1e9", "lookup_queue", 1e9, "lookup_queue = 1000000000, want 1 to 65536"},
		{"transfer_workers 1e9", "transfer_workers", 1e9, "transfer_workers = 1000000000, want 1 to 256"},
		{"save_retries 1e9", "save_retries", 1e9, "save_retries = 1000000000, want 0 to 100"},
		{"save_retries -1", "save_retries", -1, "save_retries = -1, want 0 to 100"},
		{"batch_blocks 1e9", "batch_blocks", 1e9, "batch_blocks = 1000000000, want 1 to 65536"},
		{"retry_steps 1e9", "retry_steps", 1e9, "retry_steps = 1000000000, want 1 to 1048576"},
		{"verify_chunk 1e12", "verify_chunk", 1e12, "verify_chunk = 1000000000000, want 0 to 1073741824"},
		{"layer_chunks 1e6", "layer_chunks", 1e6, "layer_chunks = 1000000, want 1 to 1024"},
		{"store_timeout 48h", "store_timeout", "48h", "store_timeout = 48h0m0s, want at most 24h0m0s"},
		{"store_timeout 0", "store_timeout", "0s", "store_timeout = 0s, want > 0"},
		{"failed_ttl negative", "failed_ttl", "-1s", "failed_ttl = -1s"},
		{"event_poll 1m", "event_poll", "1m", "event_poll = 1m0s, want at most 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{tc.key: tc.value}}
			env := connector.Env{Identity: identity(1, 1), Store: st}
			if _, err := connector.OpenPlanner(cfg, env); !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("OpenPlanner(%s = %v) = %v, want ErrConfig containing %q", tc.key, tc.value, err, tc.want)
			}
			if _, err := connector.OpenWorker(cfg, env); !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("OpenWorker(%s = %v) = %v, want ErrConfig containing %q", tc.key, tc.value, err, tc.want)
			}
		})
	}
	// The bounds themselves are accepted.
	cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"lookup_workers": 256, "transfer_workers": 256, "save_retries": 100, "failed_ttl": "0s"}}
	s, err := connector.OpenPlanner(cfg, connector.Env{Identity: identity(1, 1), Store: st})
	if err != nil {
		t.Fatalf("OpenPlanner at the bounds: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestBoundaryMisuse: calls an engine must not make, each an error naming
// the argument and the value, or a documented behaviour.
func TestBoundaryMisuse(t *testing.T) {
	t.Run("zero BlockHash in Match", func(t *testing.T) {
		r := newRig(t, newMem(t), identity(1, 1), map[string]any{"lookup": "sync"})
		req := request("z", 4*bs+1)
		req.Hashes = slices.Clone(req.Hashes)
		req.Hashes[2] = hashing.BlockHash{}
		if _, err := r.s.Match(req, 0); err == nil || !strings.Contains(err.Error(), `Match("z"): Request.Hashes[2] is the zero BlockHash`) {
			t.Errorf("Match with a zero hash = %v, want an error naming Hashes[2]", err)
		}
	})
	t.Run("zero BlockHash in Scheduled", func(t *testing.T) {
		r := newRig(t, newMem(t), identity(1, 1), nil)
		req := request("z", 4*bs+1)
		req.Hashes = slices.Clone(req.Hashes)
		req.Hashes[3] = hashing.BlockHash{}
		if err := r.s.Scheduled(req, req.Prompt, blocks(5)); err == nil || !strings.Contains(err.Error(), `Scheduled("z"): Request.Hashes[3] is the zero BlockHash`) {
			t.Errorf("Scheduled with a zero hash = %v, want an error naming Hashes[3]", err)
		}
		if m := r.s.Plan(); len(m.Saves) != 0 {
			t.Errorf("the refused Scheduled planned %d saves", len(m.Saves))
		}
	})
	t.Run("computed past Request.Tokens", func(t *testing.T) {
		r := newRig(t, newMem(t), identity(1, 1), nil)
		req := request("c", 40)
		req.Tokens = make([]hashing.Token, 40)
		if err := r.s.Scheduled(req, 41, blocks(11)); err == nil || !strings.Contains(err.Error(), "computed = 41 is more than the 40 tokens of Request.Tokens") {
			t.Errorf("Scheduled(computed 41 of 40 tokens) = %v, want an error naming both", err)
		}
	})
	t.Run("computed past Prompt without Tokens is a decode", func(t *testing.T) {
		// Documented: an engine need not count its decodes in Prompt;
		// the blocks the Hashes cover are saved, the rest later.
		r := newRig(t, newMem(t), identity(1, 1), nil)
		req := request("d", 40)
		if err := r.s.Scheduled(req, 41, blocks(11)); err != nil {
			t.Fatalf("Scheduled(computed 41, Prompt 40) = %v, want nil", err)
		}
		if m := r.s.Plan(); len(m.Saves) != 1 || len(m.Saves[0].Blocks) != 10 {
			t.Errorf("planned %+v, want one save of the 10 blocks the hashes cover", m.Saves)
		}
	})
	t.Run("SaveLayer after Save", func(t *testing.T) {
		r := newRig(t, newMem(t), identity(1, 1), nil)
		w := r.ws[0].(connector.LayerWorker)
		if err := w.Start(context.Background(), r.s.Plan()); err != nil {
			t.Fatal(err)
		}
		if err := w.Save(context.Background(), connector.Ready); err != nil {
			t.Fatal(err)
		}
		err := w.SaveLayer(context.Background(), 0, connector.Ready)
		if !errors.Is(err, connector.ErrLayer) || !strings.Contains(err.Error(), "SaveLayer(0) after Save in step") {
			t.Errorf("SaveLayer after Save = %v, want ErrLayer naming it", err)
		}
	})
	t.Run("block 999 of 32 with Env.Blocks unset", func(t *testing.T) {
		// Documented (Env.Blocks): without it the scheduler half cannot
		// know the pool, and the worker refuses the Metadata that names
		// the block, before it moves any byte.
		r := newRig(t, newMem(t), identity(1, 1), map[string]any{"lookup": "sync"})
		req := request("far", 3*bs)
		bad := []connector.BlockID{0, 1, 999}
		if err := r.s.Scheduled(req, req.Prompt, bad); err != nil {
			t.Fatalf("Scheduled without Env.Blocks = %v, want nil: the half cannot check", err)
		}
		err := r.ws[0].Start(context.Background(), r.s.Plan())
		if !errors.Is(err, connector.ErrInvalidBlock) || !strings.Contains(err.Error(), "block 999") {
			t.Errorf("Start of a Metadata naming block 999 of 32 = %v, want ErrInvalidBlock naming it", err)
		}
	})
	t.Run("block 999 with Env.Blocks", func(t *testing.T) {
		cfg := connector.Config{Connector: storeconn.Name}
		s, err := connector.OpenPlanner(cfg, connector.Env{Identity: identity(1, 1), Store: newMem(t), Blocks: 32})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		req := request("far", 3*bs)
		if err := s.Scheduled(req, req.Prompt, []connector.BlockID{0, 1, 999}); !errors.Is(err, connector.ErrInvalidBlock) || !strings.Contains(err.Error(), "blocks[2] = 999, want [0, 32)") {
			t.Errorf("Scheduled(block 999 of 32) = %v, want ErrInvalidBlock naming it", err)
		}
	})
}

// TestScheduledNoBlockInWindow: a sliding-window table whose window
// before the computed position has a NoBlock entry is refused, naming the
// entry; entries before the window may be NoBlock.
func TestScheduledNoBlockInWindow(t *testing.T) {
	h := newHybridRig(t, nil)
	req := request("w", 8*bs+1)
	// The window before position 8*bs+1 covers blocks (8*bs+1-window+1)/bs
	// to 8.
	first := (8*bs + 1 - window + 1) / bs
	hole := table(9, func(i int) bool { return i != 7 })
	err := h.s.Scheduled(req, 8*bs+1, blocks(9), hole, blocks(9))
	if !errors.Is(err, connector.ErrInvalidBlock) || !strings.Contains(err.Error(), "blocks[1][7] = NoBlock, inside the") {
		t.Errorf("Scheduled with NoBlock at 7 inside the window = %v, want ErrInvalidBlock naming blocks[1][7]", err)
	}
	if first > 0 {
		before := table(9, func(i int) bool { return i >= first })
		if err := h.s.Scheduled(req, 8*bs+1, blocks(9), before, blocks(9)); err != nil {
			t.Errorf("Scheduled with NoBlock before the window (blocks < %d) = %v, want nil", first, err)
		}
	}
}

// TestBlockBytesAgainstIdentity: documented behaviour. KVCache.BlockBytes
// is not derived from the identity (engines pad, pack and add scales to
// their blocks), so Register accepts 32 bytes where the layout's heads
// would make 256; two engines of one namespace whose blocks differ in
// size never exchange bytes: every load of the other's values fails (the
// value does not have the block's length), and nothing is copied.
func TestBlockBytesAgainstIdentity(t *testing.T) {
	st := newMem(t)
	a := newRig(t, st, identity(1, 1), map[string]any{"lookup": "sync"}) // BlockBytes 64
	req := request("a", 3*bs+1)
	a.saveAll(req)

	cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"lookup": "sync"}}
	env := connector.Env{Identity: identity(1, 1), Store: st}
	s, err := connector.OpenPlanner(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := connector.OpenWorker(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	kv := connector.KVCache{Layers: 2, Blocks: 8, KV: 2, BlockBytes: 32, Order: connector.BlockMajor}
	m, err := rdma.AllocHost(kv.Blocks * kv.BlockSize())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	kv.Regions = []rdma.Region{m.Region()}
	if err := w.Register(kv); err != nil {
		t.Fatalf("Register(BlockBytes 32) = %v, want nil: the identity does not fix a block's bytes", err)
	}
	for i := range m.Bytes() {
		m.Bytes()[i] = 0xEE
	}
	mt, err := s.Match(req, 0)
	if err != nil || mt.Tokens != 3*bs {
		t.Fatalf("Match = %+v, %v; want %d tokens", mt, err, 3*bs)
	}
	if err := s.Allocated(req, mt.Tokens, blocks(4)); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background(), s.Plan()); err != nil {
		t.Fatal(err)
	}
	var fails []connector.LoadFailure
	for d := newDeadline(t, "the end of the load"); ; d.tick() {
		if err := w.Save(context.Background(), connector.Ready); err != nil {
			t.Fatal(err)
		}
		p, err := s.Update([]*connector.Output{w.Poll()})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(p.Loaded, req.ID) {
			t.Fatal("values of 64-byte blocks loaded into 32-byte blocks")
		}
		if fails = p.Failed; len(fails) > 0 {
			break
		}
		if err := w.Start(context.Background(), s.Plan()); err != nil {
			t.Fatal(err)
		}
	}
	if fails[0].Valid != 0 {
		t.Errorf("LoadFailure.Valid = %d, want 0", fails[0].Valid)
	}
	if ws := w.(connector.StatsReporter).Stats(); ws.LoadFailures == 0 || ws.Loads != 0 {
		t.Errorf("worker Stats: LoadFailures = %d, Loads = %d; want the blocks failed, none loaded", ws.LoadFailures, ws.Loads)
	}
	for i, c := range m.Bytes() {
		if c != 0xEE {
			t.Fatalf("byte %d of the 32-byte blocks changed: a failed load wrote", i)
		}
	}
}

// TestOpenDirect: the halves open without the registry, with their
// concrete types; a config naming another connector is refused.
func TestOpenDirect(t *testing.T) {
	st := newMem(t)
	env := connector.Env{Identity: identity(1, 1), Store: st}
	s, err := storeconn.OpenPlanner(connector.Config{}, env)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := storeconn.OpenWorker(connector.Config{Connector: storeconn.Name}, env)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if s.Namespace().String() == "" || w.Wake() == nil {
		t.Error("the halves opened directly lack their namespace or Wake channel")
	}
	if _, err := storeconn.OpenWorker(connector.Config{Connector: "P2PConnector"}, env); !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), `Config.Connector = "P2PConnector"`) {
		t.Errorf("OpenWorker of a P2PConnector config = %v, want ErrConfig naming it", err)
	}
}
