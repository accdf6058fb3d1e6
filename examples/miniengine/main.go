// Command miniengine is a small but real inference engine built on
// kvconnect: a float32 transformer with paged KV memory, the scheduler
// package's block pool and planner, and the reference store connector over
// the embedded store. It runs a multi-turn chat workload with the connector
// off and on, without and with eviction pressure, prints a table of
// throughput, latency and KV hit rates, and checks that every generated
// token is the same with the connector as without it.
//
//	go run ./examples/miniengine
//
// With -model hybrid it runs a hybrid model instead (sliding-window
// attention, full attention and a gated linear recurrence, layer by layer
// in turn), whose K, V and recurrent states live in one paged pool per KV
// cache group and go through the same scheduler and connector:
//
//	go run ./examples/miniengine -model hybrid
//
// Flags set the workload, the model, the KV pool and the scenarios: two
// instances sharing one store (-instances 2), a cold start of a new
// instance (-cold-start), an online weight update mid-run
// (-weight-update-at N), and store faults (-fault-rate).
//
// With -pd it also runs disaggregated prefill and decode over the p2p
// connector: once in one process (loopback transfer engine), and once as
// two processes that it starts from its own binary, a prefill instance
// and a decode instance, moving the KV over -pd-transfer: shm (the
// default, one Linux host) or mooncake (the Mooncake Transfer Engine,
// MOONCAKE_TRANSFER_ENGINE_LIBRARY and the MOONCAKE_* settings). This
// process coordinates them (see pdproc.go):
//
//	go run ./examples/miniengine -pd
//	go run ./examples/miniengine -pd -pd-transfer mooncake
//
// With -tp N the transformer's heads split over N tensor-parallel ranks,
// each with its own KV memory and connector worker; -tp-procs adds a run
// whose ranks are processes of their own, started from this binary, that
// get each step's encoded Metadata over a unix socket, send their encoded
// Outputs back and reach the embedded store served by store/remote (see
// tpproc.go). A rank process killed mid-run is replaced, and every request
// recomputes:
//
//	go run ./examples/miniengine -tp 2 -tp-procs
//
// With -json the report is JSON: every run's figures (the median run of
// each configuration with -repeat), the loaded blocks that failed
// verification (verification_failures), and a verdict for every run and
// repeat against the first run without a connector (verdicts), besides
// outputs_identical for all of them. When outputs differ the command ends
// with an error in both modes, and -keep then does not keep the Mooncake
// client up: only a run whose outputs are right leaves its keys served.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/kvevents"
	"github.com/kvconnect/kvconnect/connector/p2p"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/mooncake"
	"github.com/kvconnect/kvconnect/store/storetest"
	"github.com/kvconnect/kvconnect/store/tiered"
)

// Options are everything a run takes; flags fill them.
type Options struct {
	Workload Workload
	Kind     string // the model: "transformer" (the default) or "hybrid"
	Model    ModelConfig
	Window   int // the hybrid model's sliding window in tokens
	Block    int // tokens per block

	Blocks         int           // KV pool without pressure; 0: every session's history fits
	PressureBlocks int           // KV pool under pressure; 0: a third of Blocks
	StoreBytes     int64         // embedded store capacity; 0: everything fits
	Batch          int           // max batched tokens per step
	Par            int           // goroutines per step
	FaultRate      float64       // store faults per key, for the faults scenario
	StoreLatency   time.Duration // added to every store call of the ON runs, as a remote store's round trip
	StoreBandwidth int64         // bytes per second of the ON runs' store transfers (storetest's Faulty Bandwidth); 0: unlimited
	PrefillRate    int           // kv_connector_extra_config "prefill_tokens_per_s": loads slower than this do not count; 0: off
	Verify         string        // kv_connector_extra_config "verify": "checksum" or "none"

	Store          string        // "memstore" (embedded), "tiered" (memstore over diskstore) or "mooncake"
	Tiered         TieredOptions // -store tiered
	MooncakeConfig string        // Mooncake client config file; "" reads MOONCAKE_CONFIG_PATH, then MOONCAKE_MASTER

	Tenant string // the ON runs' tenant; "" gives each run a fresh one
	Keep   bool   // keep the ON runs' keys, and the Mooncake client up until interrupted

	Instances      int    // engines sharing one store (ON runs)
	ColdStart      bool   // run the cold-start scenario
	PD             bool   // run disaggregated prefill and decode over the p2p connector
	PDTransfer     string // -pd across processes: the p2p connector's transfer engine, "shm" or "mooncake"; "loopback": in one process only
	WeightUpdateAt int    // rotate the weights after this many requests end (0: never)

	Wait      bool   // block while every engine waits for its connector (connector.Waker), instead of stepping
	Layerwise bool   // -layerwise: compute layer by layer, loading and saving each layer's KV as its own store value (connector.LayerWorker)
	TP        int    // -tp: tensor-parallel ranks of the transformer (1: none)
	TPProcs   bool   // -tp-procs: also run the ranks as processes of their own, over the embedded store served on a unix socket
	Metrics   string // -metrics: serve the ON runs' Prometheus metrics on this address
	KVEvents  string // -kv-events: publish the ON runs' KV events on this ZMQ endpoint

	Repeat   int // runs of each configuration; the table shows the median-duration run
	JSON     bool
	Progress bool
	tty      bool // progress goes to a terminal: redraw one line

	wrapStore     func(store.Store) store.Store                    // tests: wraps the ON runs' store
	shared        store.Store                                      // an open Mooncake client every ON run shares
	tenant        string                                           // the ON runs' tenant; each run gets its own
	runs          *int                                             // ON runs so far, naming their tenants
	obs           *observer                                        // with -metrics
	sink          *eventSink                                       // with -kv-events
	onRun         func(*observer)                                  // tests: called at the end of each ON run, its engines still open
	events        *kvevents.Stats                                  // tests: the publisher's counters when it closed
	pdKeep        time.Duration                                    // tests: the p2p keep_timeout of -pd across processes (0: pdKeepTimeout)
	pdOnEnd       func(ended int, prefill, decode *os.Process)     // tests: called as each request ends, before the next turn's submission, -pd across processes
	pdOnPrefilled func(n int, prefill *os.Process)                 // tests: called as the prefill instance ends each request, before the decode instance has it, -pd across processes
	tpOnStep      func(m *connector.Metadata, ranks []*os.Process) // tests: called before each step of -tp-procs, with its Metadata (nil: none) and the rank processes
	tpDie         struct {                                         // tests: the first process of rank rank exits at at (tpConfig.DieAt)
		rank int
		at   string
	}
}

func defaultOptions() Options {
	return Options{
		Workload:   Workload{Sessions: 8, System: 128, FirstTurn: 768, Growth: 192, Output: 16, Turns: 4, Seed: 1},
		Kind:       "transformer",
		Model:      ModelConfig{Vocab: 512, Dim: 64, Heads: 4, Layers: 2, FFN: 128, Seed: 1},
		Window:     64,
		Block:      16,
		Verify:     "checksum",
		Batch:      512,
		Par:        runtime.NumCPU(),
		Instances:  1,
		Store:      "memstore",
		Tiered:     TieredOptions{DiskBytes: 1 << 30},
		PDTransfer: defaultPDTransfer(),
		Repeat:     1,
		TP:         1,
		Progress:   true,
		Wait:       true,
	}
}

// defaultPDTransfer is -pd-transfer's default: shm where rdma/shm runs.
func defaultPDTransfer() string {
	if runtime.GOOS == "linux" {
		return p2p.TransferShm
	}
	return p2p.TransferLoopback
}

func main() {
	if os.Getenv(restartDirEnv) != "" {
		// The second process of -restart.
		os.Exit(restartChild(context.Background(), os.Stdout, os.Stderr))
	}
	if os.Getenv(tpRoleEnv) != "" {
		// A rank of -tp-procs: it ends when its input does.
		signal.Ignore(os.Interrupt, syscall.SIGPIPE)
		os.Exit(tpRank(context.Background(), os.Stderr))
	}
	if os.Getenv(pdRoleEnv) != "" {
		// An instance of -pd across processes: its coordinator ends it
		// (by ending its input), not the terminal's interrupt.
		signal.Ignore(os.Interrupt)
		// Its stderr is a pipe to the coordinator: once the coordinator
		// is gone, a write there fails rather than kill the process.
		signal.Ignore(syscall.SIGPIPE)
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		code := pdInstance(ctx, os.Stderr)
		stop()
		os.Exit(code)
	}
	o := defaultOptions()
	fs := flag.NewFlagSet("miniengine", flag.ExitOnError)
	w := &o.Workload
	fs.IntVar(&w.Sessions, "sessions", w.Sessions, "concurrent multi-turn sessions")
	fs.IntVar(&w.System, "system", w.System, "tokens of the system prompt all sessions share")
	fs.IntVar(&w.FirstTurn, "first", w.FirstTurn, "user tokens of a session's first turn")
	fs.IntVar(&w.Growth, "growth", w.Growth, "user tokens each later turn adds")
	fs.IntVar(&w.Output, "output", w.Output, "tokens generated per turn")
	fs.IntVar(&w.Turns, "turns", w.Turns, "turns per session")
	fs.Uint64Var(&w.Seed, "seed", w.Seed, "seed of the workload's tokens")
	fs.StringVar(&o.Kind, "model", o.Kind, "the model: transformer, or hybrid (sliding-window attention, full attention and a gated linear recurrence, layer by layer in turn; 3 layers unless -layers says otherwise)")
	fs.IntVar(&o.Window, "window", o.Window, "sliding window in tokens of the hybrid model's window layers")
	fs.IntVar(&o.Model.Layers, "layers", o.Model.Layers, "model layers")
	fs.IntVar(&o.Model.Dim, "dim", o.Model.Dim, "model width")
	fs.IntVar(&o.Model.Heads, "heads", o.Model.Heads, "attention heads")
	fs.Uint64Var(&o.Model.Seed, "weights", o.Model.Seed, "weights version: the seed of the model's weights")
	fs.IntVar(&o.Block, "block", o.Block, "tokens per KV block")
	fs.IntVar(&o.Blocks, "blocks", o.Blocks, "KV pool size in blocks without pressure (0: every history fits)")
	fs.IntVar(&o.PressureBlocks, "pressure-blocks", o.PressureBlocks, "KV pool size in blocks under pressure (0: a third of -blocks)")
	fs.Int64Var(&o.StoreBytes, "store-bytes", o.StoreBytes, "embedded store capacity in bytes (0: everything fits)")
	fs.IntVar(&o.Batch, "batch", o.Batch, "max batched tokens per step")
	fs.IntVar(&o.Par, "par", o.Par, "goroutines computing a step")
	fs.StringVar(&o.Store, "store", o.Store, "the store of the ON runs: memstore (embedded), tiered (a memstore over a diskstore, see -ram-bytes, -disk-bytes, -disk-dir, -restart) or mooncake")
	o.Tiered.flags(fs)
	fs.StringVar(&o.MooncakeConfig, "mooncake-config", o.MooncakeConfig, "Mooncake client config file (default: $MOONCAKE_CONFIG_PATH, else $MOONCAKE_MASTER); the library comes from $MOONCAKE_STORE_LIBRARY")
	fs.StringVar(&o.Tenant, "tenant", o.Tenant, "tenant of the ON runs' keys (default: a fresh tenant per run, removed after it); fix it to share keys across runs and processes (then ON runs after the first start warm)")
	fs.BoolVar(&o.Keep, "keep", o.Keep, "keep the ON runs' keys; with -store mooncake, also keep the client up (its segment holds the values) until interrupted, unless the outputs differ from the run without a connector (text and -json alike)")
	fs.IntVar(&o.Instances, "instances", o.Instances, "engine instances sharing one store in the ON runs; sessions alternate between them turn by turn")
	fs.BoolVar(&o.ColdStart, "cold-start", o.ColdStart, "also run the cold-start scenario: a new instance serves a workload another one already ran")
	fs.BoolVar(&o.PD, "pd", o.PD, "also run disaggregated prefill/decode: a prefill instance hands every request's KV to a decode instance (p2p connector), in one process over the loopback transfer engine, and as two processes started from this binary over -pd-transfer")
	fs.StringVar(&o.PDTransfer, "pd-transfer", o.PDTransfer, "with -pd, the transfer engine between the prefill and decode processes: shm (same host, Linux), or mooncake (Mooncake Transfer Engine: MOONCAKE_TRANSFER_ENGINE_LIBRARY, MOONCAKE_LOCAL_HOSTNAME, ...); loopback runs prefill/decode in one process only")
	fs.IntVar(&o.WeightUpdateAt, "weight-update-at", o.WeightUpdateAt, "rotate to new weights after this many requests end (0: never)")
	fs.StringVar(&o.Verify, "verify", o.Verify, "check every loaded block against the trailer saved with it (checksum) or not (none)")
	fs.Float64Var(&o.FaultRate, "fault-rate", o.FaultRate, "fail this share of store keys at random (ON runs)")
	fs.Int64Var(&o.StoreBandwidth, "store-bandwidth", o.StoreBandwidth, "move the ON runs' store values at this many bytes per second, as a slow disk or link (0: unlimited)")
	fs.IntVar(&o.PrefillRate, "prefill-rate", o.PrefillRate, "the engine's prefill speed in tokens per second, for the connector's prefill_tokens_per_s: a match counts no block while loads run slower (0: off)")
	fs.DurationVar(&o.StoreLatency, "store-latency", o.StoreLatency, "add this latency to every store call of the ON runs, as a remote store's round trip (lookups then run beside the engine, as with Mooncake)")
	fs.BoolVar(&o.Layerwise, "layerwise", o.Layerwise, "compute each step layer by layer, loading and saving every layer's KV as its own store value (layer_chunks = layers): a request whose prefix is in the store runs in the step that loads it, layer l as soon as its KV is in (the transformer model)")
	fs.IntVar(&o.TP, "tp", o.TP, "tensor-parallel ranks: the transformer's heads split over this many ranks, each with its own KV memory and connector worker, storing its own shard's keys")
	fs.BoolVar(&o.TPProcs, "tp-procs", o.TPProcs, "also run the connector-on workload with the -tp ranks as processes of their own, started from this binary: the scheduler ships each step's encoded Metadata to them over unix sockets and gets their encoded Outputs back, and they reach the embedded store served on a unix socket (store/remote)")
	fs.BoolVar(&o.Wait, "wait", o.Wait, "while every engine has nothing to compute, block until a connector has news (connector.Waker) instead of stepping to poll")
	fs.StringVar(&o.Metrics, "metrics", o.Metrics, "serve the Prometheus metrics of the latest run with the connector on, from its start, at http://ADDR/metrics, for example 127.0.0.1:9400")
	fs.StringVar(&o.KVEvents, "kv-events", o.KVEvents, "publish the KV events of the runs with the connector on, as vLLM does, on a ZMQ PUB socket at this endpoint: bound for a wildcard host or port 0, for example tcp://*:5557 (replay bound on the next port), connected to for any other host, as vLLM does, for example tcp://router:5557 where a router's SUB binds (no replay)")
	fs.IntVar(&o.Repeat, "repeat", o.Repeat, "run each configuration this many times, OFF and ON interleaved; the table shows each one's median-duration run")
	fs.BoolVar(&o.JSON, "json", o.JSON, "print the results as JSON")
	fs.BoolVar(&o.Progress, "progress", o.Progress, "print a progress line while running")
	fs.Parse(os.Args[1:])
	if err := noArgs(fs.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "miniengine:", err)
		fs.Usage()
		os.Exit(2)
	}
	layersSet := false
	fs.Visit(func(f *flag.Flag) { layersSet = layersSet || f.Name == "layers" })
	if o.Kind == "hybrid" && !layersSet {
		o.Model.Layers = 3 // one layer of each kind
	}
	if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		o.tty = true
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Main(ctx, o, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "miniengine:", err)
		os.Exit(1)
	}
}

// Validate names the first option out of range.
// noArgs refuses the arguments left after the flags: the mini-engine
// takes none, and one there is a flag written wrongly (-tp 2 -- -pd, say,
// or a value without its flag).
func noArgs(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected argument %q (%d in all): every setting is a flag, see -h", args[0], len(args))
	}
	return nil
}

func (o *Options) Validate() error {
	w := o.Workload
	for _, f := range []struct {
		name string
		v    int
		min  int
	}{
		{"sessions", w.Sessions, 1}, {"first", w.FirstTurn, 1}, {"growth", w.Growth, 0}, {"system", w.System, 0},
		{"output", w.Output, 1}, {"turns", w.Turns, 1}, {"layers", o.Model.Layers, 1}, {"dim", o.Model.Dim, 1},
		{"heads", o.Model.Heads, 1}, {"block", o.Block, 1}, {"batch", o.Batch, 1}, {"par", o.Par, 1},
		{"instances", o.Instances, 1}, {"blocks", o.Blocks, 0}, {"pressure-blocks", o.PressureBlocks, 0},
		{"repeat", o.Repeat, 1}, {"tp", o.TP, 1}, {"weight-update-at", o.WeightUpdateAt, 0},
	} {
		if f.v < f.min {
			return fmt.Errorf("-%s = %d, want >= %d", f.name, f.v, f.min)
		}
	}
	if o.Model.Dim%o.Model.Heads != 0 {
		return fmt.Errorf("-dim = %d is not a multiple of -heads = %d", o.Model.Dim, o.Model.Heads)
	}
	if o.Model.Heads%o.TP != 0 {
		return fmt.Errorf("-tp = %d does not divide -heads = %d: each rank holds whole heads", o.TP, o.Model.Heads)
	}
	if o.TP > 1 {
		for _, c := range []struct {
			on   bool
			flag string
		}{{o.Kind != "transformer", "-model " + o.Kind}, {o.Layerwise, "-layerwise"}, {o.PD, "-pd"}} {
			if c.on {
				return fmt.Errorf("-tp = %d with %s: tensor parallelism runs the transformer, a step at a time, in one instance", o.TP, c.flag)
			}
		}
	}
	if o.TPProcs {
		switch {
		case o.TP < 2:
			return fmt.Errorf("-tp-procs needs -tp 2 or more: the ranks are the processes")
		case o.Store != "memstore":
			return fmt.Errorf("-tp-procs with -store %s: the rank processes reach the embedded store, served on a unix socket; with Mooncake each rank would be a client of its own", o.Store)
		case runtime.GOOS == "windows":
			return fmt.Errorf("-tp-procs needs unix sockets and signals, not %s", runtime.GOOS)
		}
	}
	if o.Layerwise && o.PD {
		return fmt.Errorf("-layerwise with -pd: the p2p connector's workers move whole blocks (they are not connector.LayerWorkers); run them apart")
	}
	switch o.Kind {
	case "transformer":
	case "hybrid":
		if o.Layerwise {
			return fmt.Errorf("-layerwise runs the transformer model; -model hybrid computes a step item by item")
		}
		switch {
		case o.Model.Layers < 3:
			return fmt.Errorf("-layers = %d, want >= 3 with -model hybrid: a layer of each kind", o.Model.Layers)
		case o.Window < 1:
			return fmt.Errorf("-window = %d, want >= 1", o.Window)
		case o.Batch < o.Block:
			return fmt.Errorf("-batch = %d, want >= -block = %d with -model hybrid: prefill chunks end at block boundaries", o.Batch, o.Block)
		case o.PD:
			return fmt.Errorf("-pd needs -model transformer: the p2p connector refuses hybrid layouts")
		}
	default:
		return fmt.Errorf("-model = %q, want transformer or hybrid", o.Kind)
	}
	switch o.PDTransfer {
	case p2p.TransferLoopback, p2p.TransferMooncake:
	case p2p.TransferShm:
		if o.PD && runtime.GOOS != "linux" {
			return fmt.Errorf("-pd-transfer = shm needs Linux (rdma/shm), not %s: use -pd-transfer loopback (prefill and decode in one process) or mooncake", runtime.GOOS)
		}
	default:
		return fmt.Errorf("-pd-transfer = %q, want shm, mooncake or loopback", o.PDTransfer)
	}
	if o.Store != "memstore" && o.Store != "mooncake" && o.Store != "tiered" {
		return fmt.Errorf("-store = %q, want memstore, tiered or mooncake", o.Store)
	}
	if err := o.Tiered.validate(o.Store); err != nil {
		return err
	}
	if o.Keep && o.Store != "mooncake" {
		return fmt.Errorf("-keep needs -store mooncake: the embedded store lives and dies with this process")
	}
	if o.Keep && o.Tenant == "" {
		return fmt.Errorf("-keep needs -tenant NAME: another process finds the kept keys under that tenant")
	}
	if o.StoreBandwidth < 0 || o.PrefillRate < 0 {
		return fmt.Errorf("-store-bandwidth = %d, -prefill-rate = %d, want >= 0", o.StoreBandwidth, o.PrefillRate)
	}
	if o.StoreLatency < 0 {
		return fmt.Errorf("-store-latency = %v, want >= 0", o.StoreLatency)
	}
	if o.FaultRate < 0 || o.FaultRate > 1 {
		return fmt.Errorf("-fault-rate = %v, want [0, 1]", o.FaultRate)
	}
	need := (w.maxContext() + o.Block - 1) / o.Block
	if o.Blocks == 0 {
		o.Blocks = w.Sessions*need + need
	}
	if o.PressureBlocks == 0 {
		o.PressureBlocks = max(o.Blocks/3, 2*need)
	}
	if o.Blocks < need || o.PressureBlocks < need {
		return fmt.Errorf("a pool of %d blocks (pressure %d) cannot hold one request of %d blocks", o.Blocks, o.PressureBlocks, need)
	}
	if o.Model.FFN == 0 {
		o.Model.FFN = 2 * o.Model.Dim
	}
	return nil
}

// identity is the engine's namespace identity for weights generation gen.
func (o Options) identity(gen uint64) hashing.Identity {
	tenant := o.tenant
	if tenant == "" {
		tenant = "miniengine"
	}
	return hashing.Identity{
		Tenant:         tenant,
		Model:          "kvconnect-mini",
		WeightsVersion: fmt.Sprintf("seed-%d", o.Model.Seed),
		Generation:     gen,
		Format:         hashing.Format{Device: "cpu", ModelDType: hashing.FP32, KVDType: hashing.FP32},
		Layout:         o.layout(),
	}
}

func (o Options) layout() hashing.Layout {
	l := hashing.Layout{
		Layers: o.Model.Layers, KVHeads: o.Model.Heads, HeadDim: o.Model.Dim / o.Model.Heads,
		BlockSize: o.Block, TPSize: max(o.TP, 1), Replication: 1,
	}
	if o.Kind == "hybrid" {
		l.Groups = hybridGroupsOf(o.Model.Layers, o.Block, o.Window, o.Model.Dim)
	}
	return l
}

// model returns the model of weights generation gen: an online weight
// update changes the weights, so the seed mixes in the generation.
func (o Options) model(gen uint64) *Model {
	c := o.Model
	c.Seed = o.Model.Seed*1_000_003 + gen
	return NewModel(c)
}

// hybrid returns the hybrid model of weights generation gen.
func (o Options) hybrid(gen uint64) *HybridModel {
	c := o.Model
	c.Seed = o.Model.Seed*1_000_003 + gen
	return NewHybridModel(c, o.Window)
}

// engineConfig returns the configuration of an engine of weights
// generation gen whose full-attention pool has blocks blocks: the
// transformer's, or the hybrid model's with a sliding-window pool of half
// as many blocks and a state pool of a quarter (a request holds a window
// and a state per chunk and per block of output, far fewer than its
// context's blocks), never fewer than one step needs.
func (o Options) engineConfig(gen uint64, blocks int) EngineConfig {
	c := EngineConfig{Identity: o.identity(gen), Blocks: blocks, MaxBatchedTokens: o.Batch, Par: o.Par, Layerwise: o.Layerwise, TP: o.TP}
	if o.Kind != "hybrid" {
		c.Model = o.model(gen)
		return c
	}
	c.Hybrid = o.hybrid(gen)
	c.Blocks = 0
	c.GroupBlocks = o.groupBlocks(blocks)
	return c
}

// groupBlocks returns the hybrid model's pool sizes, per KV cache group,
// for a full-attention pool of blocks blocks.
func (o Options) groupBlocks(blocks int) []int {
	blocksOf := func(tokens int) int { return (tokens + o.Block - 1) / o.Block }
	return []int{blocks, max(blocks/2, 2*blocksOf(o.Window)+blocksOf(o.Batch)+1), max(blocks/4, 3)}
}

// rotate moves engine e to the weights of generation gen.
func (o Options) rotate(e *Engine, gen uint64) error {
	if o.Kind == "hybrid" {
		return e.Rotate(gen, nil, o.hybrid(gen))
	}
	return e.Rotate(gen, o.model(gen), nil)
}

// connectorConfig is the kv_transfer_config of the ON runs. The embedded
// store answers an exists probe in about 100 ns a key, so lookups run
// inside Match ("sync") rather than a step later; Mooncake answers in a
// master round trip (about 0.1 ms), so they run beside the engine
// ("async", the default).
func (o Options) connectorConfig() connector.Config {
	lookup := "sync"
	if o.Store == "mooncake" || o.StoreLatency > 0 {
		lookup = "async"
	}
	return connector.Config{
		Connector: storeconn.Name,
		Role:      connector.RoleBoth,
		Extra:     o.extra(map[string]any{"lookup": lookup, "verify": o.Verify, "prefill_tokens_per_s": o.PrefillRate}),
	}
}

// extra adds the settings of -layerwise to a kv_connector_extra_config:
// a value per layer of each block.
func (o Options) extra(m map[string]any) map[string]any {
	if o.Layerwise {
		m["layer_chunks"] = o.Model.Layers
	}
	return m
}

// newStore returns the embedded store every ON run shares between its
// engines, with faults injected when asked.
func (o Options) newStore() (store.Store, func() error, error) {
	if o.shared != nil {
		// A Mooncake cluster outlives the run: the run's keys live under
		// a tenant of their own (see runOnce) and are removed after it.
		var st store.Store = noClose{o.shared}
		if o.wrapStore != nil {
			st = o.wrapStore(st)
		}
		if o.FaultRate > 0 || o.StoreLatency > 0 || o.StoreBandwidth > 0 {
			st = storetest.NewFaulty(st, o.faults())
		}
		purge := func() error {
			if o.Keep || o.Tenant != "" {
				// Keys of a fixed tenant outlive the run: later runs,
				// and other processes, are served from them.
				return nil
			}
			_, err := o.shared.RemovePrefix(context.Background(), hashing.TenantPrefix(o.tenant))
			return err
		}
		return st, purge, nil
	}
	capacity := o.StoreBytes
	if capacity == 0 {
		blockBytes := int64(o.Block * o.Model.Dim * 4 * 2 * o.Model.Layers)
		capacity = int64(o.Workload.Sessions*o.Workload.Turns)*int64(o.Workload.maxContext()/o.Block+1)*blockBytes + 64<<20
	}
	var st store.Store
	var closeStore func() error
	if o.Store == "tiered" {
		t, closeTiered, err := o.newTiered(capacity)
		if err != nil {
			return nil, nil, err
		}
		st, closeStore = t, closeTiered
	} else {
		m, err := memstore.New(memstore.Config{Capacity: capacity})
		if err != nil {
			return nil, nil, err
		}
		st, closeStore = m, m.Close
	}
	if o.wrapStore != nil {
		st = o.wrapStore(st)
	}
	if o.FaultRate > 0 || o.StoreLatency > 0 || o.StoreBandwidth > 0 {
		st = storetest.NewFaulty(st, o.faults())
	}
	return st, closeStore, nil
}

// faults are the store faults of -fault-rate.
func (o Options) faults() storetest.FaultOptions {
	return storetest.FaultOptions{Seed: o.Workload.Seed, KeyRate: o.FaultRate, Ops: storetest.OpGet | storetest.OpPut | storetest.OpExists, Scribble: true, Latency: o.StoreLatency, Bandwidth: o.StoreBandwidth}
}

// forRun gives an ON run over a shared Mooncake cluster a tenant of its
// own, so that runs start cold and never see each other's keys.
func (o Options) forRun() Options {
	switch {
	case o.Tenant != "":
		o.tenant = o.Tenant
	case o.shared != nil:
		*o.runs++
		o.tenant = fmt.Sprintf("miniengine-%d-%d-%d", os.Getpid(), time.Now().Unix(), *o.runs)
	}
	return o
}

// noClose keeps a shared store open when a run ends.
type noClose struct{ store.Store }

func (noClose) Close() error { return nil }

// openShared opens the Mooncake client that every ON run uses.
func (o *Options) openShared(ctx context.Context) (func() error, error) {
	if o.Store != "mooncake" {
		return func() error { return nil }, nil
	}
	var cfg mooncake.Config
	var err error
	if o.MooncakeConfig != "" {
		cfg, err = mooncake.LoadConfig(o.MooncakeConfig)
	} else {
		cfg, err = mooncake.ConfigFromEnv()
	}
	if err != nil {
		return nil, err
	}
	// Lookups need presence only: one native call per batch.
	cfg.PresenceOnly = true
	s, err := mooncake.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	o.shared = s
	o.runs = new(int)
	return s.Close, nil
}

// keepUp, with -keep over Mooncake, keeps the client (whose segment holds
// the saved values) up until ctx is done: another process can be served
// from them meanwhile.
func (o Options) keepUp(ctx context.Context, errw io.Writer) {
	if !o.Keep || o.shared == nil {
		return
	}
	fmt.Fprintf(errw, "-keep: the Mooncake client stays up with the keys of tenant %q in its segment; interrupt to exit\n", o.Tenant)
	<-ctx.Done()
}

// Run is one run's result, as printed and as -json encodes it.
type Run struct {
	Name         string  `json:"name"`
	Connector    bool    `json:"connector"`
	Blocks       int     `json:"blocks"`
	Succeeded    int     `json:"succeeded"`
	Failed       int     `json:"failed"`
	Seconds      float64 `json:"seconds"`
	RequestsPerS float64 `json:"requests_per_s"`
	TokensPerS   float64 `json:"tokens_per_s"` // prompt + generated tokens served per second
	TTFTms       float64 `json:"mean_ttft_ms"`
	TPOTms       float64 `json:"mean_tpot_ms"`
	Latencyms    float64 `json:"mean_latency_ms"` // submission to end
	LaterTTFTms  float64 `json:"subsequent_turn_ttft_ms"`
	LocalHitRate float64 `json:"kv_hit_rate_local"`
	ExtHitRate   float64 `json:"kv_hit_rate_external"`
	Computed     int     `json:"computed_tokens"`
	BlocksLoaded int64   `json:"blocks_loaded"`
	BlocksSaved  int64   `json:"blocks_saved"`
	Failures     int64   `json:"transfer_failures"`
	Corrupt      int64   `json:"verification_failures"` // loaded blocks that failed verification (also in transfer_failures)
	ConnectorMs  float64 `json:"connector_ms"`          // lookups and transfers, summed over goroutines
	LookupMs     float64 `json:"lookup_ms"`             // of which lookups
	Lookups      int64   `json:"lookups"`
	LoadBytes    int64   `json:"bytes_loaded"`
	IdleSteps    float64 `json:"idle_steps_per_request"`  // steps that computed nothing, per request
	Transfer     string  `json:"transfer,omitempty"`      // -pd across processes: the transfer engine
	Lost         string  `json:"lost_instance,omitempty"` // -pd across processes: the instance that ended mid-run
	Rerouted     int     `json:"rerouted,omitempty"`      // -pd across processes: requests of a lost prefill instance that the decode instance computed
	RanksLost    int     `json:"ranks_lost,omitempty"`    // -tp-procs: rank processes that ended mid-run
	stats        Stats
	pd           *pdReport // -pd across processes
	tp           *tpReport // -tp-procs

	// TierTokens are, with -store tiered, the tokens loaded by the tier
	// that served them.
	TierTokens *tierTokens `json:"load_tokens_by_tier,omitempty"`
}

func newRun(name string, on bool, blocks int, st Stats) Run {
	sec := st.Duration.Seconds()
	return Run{
		Name: name, Connector: on, Blocks: blocks,
		Succeeded: st.Succeeded, Failed: st.Failed, Seconds: sec,
		RequestsPerS: float64(st.Succeeded+st.Failed) / sec,
		TokensPerS:   float64(st.PromptTokens+st.OutputTokens) / sec,
		TTFTms:       ms(st.TTFT), TPOTms: ms(st.TPOT), LaterTTFTms: ms(st.LaterTTFT), Latencyms: ms(st.Latency),
		LocalHitRate: st.HitRate(st.LocalTokens), ExtHitRate: st.HitRate(st.ExternalTokens),
		Computed: st.ComputedTokens, BlocksLoaded: st.ConnLoads, BlocksSaved: st.ConnSaves, Failures: st.ConnFailures,
		Corrupt:     st.ConnCorrupt,
		ConnectorMs: float64(st.ConnNanos) / 1e6, LoadBytes: st.ConnLoadBytes,
		LookupMs: float64(st.ConnLookupNanos) / 1e6, Lookups: st.ConnLookups,
		IdleSteps: float64(st.IdleSteps) / float64(max(1, st.Succeeded+st.Failed)),
		stats:     st,

		TierTokens: newTierTokens(st.ConnLoadTokens),
	}
}

// median returns the run of median duration.
func median(rs []Run) Run {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b Run) int { return cmp.Compare(a.Seconds, b.Seconds) })
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// runOnce runs the workload on fresh engines: connector off, or on over a
// fresh store shared by o.Instances engines.
func runOnce(ctx context.Context, o Options, on bool, blocks int, progress func(int, int)) (Stats, error) {
	var st store.Store
	if on {
		o = o.forRun()
		s, closeStore, err := o.newStore()
		if err != nil {
			return Stats{}, err
		}
		defer closeStore()
		st = s
	}
	n := 1
	if on {
		n = o.Instances
	}
	var engines []*Engine
	defer func() {
		for _, e := range engines {
			e.Close()
		}
	}()
	var rm *runMetrics
	if on {
		rm = o.obs.newRun()
		st = rm.wrap(st)
	}
	for i := range n {
		cfg := o.engineConfig(0, blocks)
		cfg.Store, cfg.Connector = st, o.connectorConfig()
		e, err := NewEngine(cfg)
		if err != nil {
			return Stats{}, err
		}
		engines = append(engines, e)
		if on {
			rm.engine(i, e)
			e.events = o.sink.forEngine(cfg)
		}
	}
	o.obs.serve(rm)
	route := func(session, turn int) int { return (session + turn) % len(engines) }
	h := hooks{wait: o.Wait}
	if o.WeightUpdateAt > 0 {
		h.onEnd = func(ended int) error {
			if ended != o.WeightUpdateAt {
				return nil
			}
			for _, e := range engines {
				if err := o.rotate(e, 1); err != nil {
					return err
				}
			}
			return nil
		}
	}
	stats, err := run(ctx, engines, o.Workload, route, h, progress)
	if on && o.onRun != nil && o.obs != nil {
		o.onRun(o.obs)
	}
	return stats, err
}

// Main runs the default comparison and the scenarios o asks for, writing
// the report to out and progress to errw.
func Main(ctx context.Context, o Options, out, errw io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.PD {
		if err := o.pdPreflight(); err != nil {
			return fmt.Errorf("-pd-transfer %s: %w", o.PDTransfer, err)
		}
	}
	closeShared, err := o.openShared(ctx)
	if err != nil {
		return fmt.Errorf("-store %s: %w", o.Store, err)
	}
	defer closeShared()
	if o.Metrics != "" {
		if o.obs, err = newObserver(o.Metrics, errw); err != nil {
			return err
		}
		defer o.obs.Close()
	}
	if o.KVEvents != "" {
		if o.sink, err = newEventSink(ctx, o, errw); err != nil {
			return err
		}
		defer func() {
			o.sink.Close()
			if o.events != nil {
				*o.events = o.sink.pub.Stats()
			}
		}()
	}
	type job struct {
		name   string
		on     bool
		blocks int
	}
	jobs := []job{
		{"no pressure, connector off", false, o.Blocks},
		{"no pressure, connector on", true, o.Blocks},
		{"eviction pressure, connector off", false, o.PressureBlocks},
		{"eviction pressure, connector on", true, o.PressureBlocks},
	}
	all := make([][]Run, len(jobs))
	for rep := 0; rep < o.Repeat; rep++ {
		for ji, j := range jobs {
			name := j.name
			if o.Repeat > 1 {
				name = fmt.Sprintf("%s (%d/%d)", j.name, rep+1, o.Repeat)
			}
			progress := func(done, total int) {}
			if o.Progress {
				progress = func(done, total int) {
					if o.tty {
						fmt.Fprintf(errw, "\r%-44s %3d/%d requests", name, done, total)
					}
					if done == total {
						if !o.tty {
							fmt.Fprintf(errw, "%-44s %3d/%d requests", name, done, total)
						}
						fmt.Fprintln(errw)
					}
				}
			}
			st, err := runOnce(ctx, o, j.on, j.blocks, progress)
			if err != nil {
				return fmt.Errorf("%s: %w", j.name, err)
			}
			all[ji] = append(all[ji], newRun(j.name, j.on, j.blocks, st))
		}
	}
	runs := make([]Run, len(jobs))
	for ji, rs := range all {
		runs[ji] = median(rs)
	}
	identical := true
	var diff []string
	var verdicts []Verdict
	for ji := range all {
		for rep, r := range all[ji] {
			// Every run, ON or OFF, repeated or not, against the first OFF run.
			v := Verdict{Name: r.Name, Repeat: rep + 1, Identical: true}
			if k, ok := sameOutputs(all[0][0].stats, r.stats); !ok {
				identical = false
				v.Identical, v.Differs = false, fmt.Sprintf("session %d turn %d differs", k.Session, k.Turn)
				diff = append(diff, fmt.Sprintf("%s (%d/%d): %s", r.Name, rep+1, o.Repeat, v.Differs))
			}
			verdicts = append(verdicts, v)
		}
	}
	var pd, pdProcs *Run
	if o.PD {
		r, err := runPD(ctx, o)
		if err != nil {
			return fmt.Errorf("prefill/decode: %w", err)
		}
		if k, ok := sameOutputs(all[0][0].stats, r.stats); !ok {
			identical = false
			diff = append(diff, fmt.Sprintf("prefill/decode: session %d turn %d differs", k.Session, k.Turn))
		}
		pd = &r
		if o.PDTransfer != p2p.TransferLoopback {
			r, err := runPDProcs(ctx, o)
			if err != nil {
				return fmt.Errorf("prefill/decode across processes (-pd-transfer %s): %w", o.PDTransfer, err)
			}
			if k, ok := sameOutputs(all[0][0].stats, r.stats); !ok {
				identical = false
				diff = append(diff, fmt.Sprintf("prefill/decode across processes: session %d turn %d differs", k.Session, k.Turn))
			}
			pdProcs = &r
		}
	}
	var tp *Run
	if o.TPProcs {
		r, err := runTPProcs(ctx, o, o.PressureBlocks)
		if err != nil {
			return fmt.Errorf("tensor-parallel ranks as processes: %w", err)
		}
		if k, ok := sameOutputs(all[0][0].stats, r.stats); !ok {
			identical = false
			diff = append(diff, fmt.Sprintf("ranks as processes: session %d turn %d differs", k.Session, k.Turn))
		}
		tp = &r
	}
	var cold *Run
	if o.ColdStart {
		r, err := coldStart(ctx, o)
		if err != nil {
			return fmt.Errorf("cold start: %w", err)
		}
		if k, ok := sameOutputs(all[0][0].stats, r.stats); !ok {
			identical = false
			diff = append(diff, fmt.Sprintf("cold start: session %d turn %d differs", k.Session, k.Turn))
		}
		cold = &r
	}
	var restarted *Run
	var restartTiers []tiered.TierStats
	if o.Tiered.Restart {
		r, ts, err := restart(ctx, o)
		if err != nil {
			return fmt.Errorf("restart: %w", err)
		}
		if k, ok := sameOutputs(all[0][0].stats, r.stats); !ok {
			identical = false
			diff = append(diff, fmt.Sprintf("restart: session %d turn %d differs", k.Session, k.Turn))
		}
		restarted, restartTiers = &r, ts
	}
	if o.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Options   Options   `json:"options"`
			Runs      []Run     `json:"runs"`
			ColdStart *Run      `json:"cold_start,omitempty"`
			PD        *Run      `json:"prefill_decode,omitempty"`
			PDProcs   *Run      `json:"prefill_decode_processes,omitempty"`
			TPProcs   *Run      `json:"tp_processes,omitempty"`
			Identical bool      `json:"outputs_identical"`
			Verdicts  []Verdict `json:"verdicts"`
		}{o, runs, cold, pd, pdProcs, tp, identical, verdicts}); err != nil {
			return err
		}
		if !identical {
			return errors.New("outputs differ between connector on and off")
		}
		o.keepUp(ctx, errw)
		return nil
	}
	printTable(out, o, runs)
	if cold != nil {
		verdict := "identical to the run without a connector"
		if k, ok := sameOutputs(all[0][0].stats, cold.stats); !ok {
			verdict = fmt.Sprintf("DIFFERENT from the run without a connector (session %d turn %d)", k.Session, k.Turn)
		}
		fmt.Fprintf(out, "\ncold start: a new instance, empty KV pool, store warm: TTFT %.1f ms, external hit rate %.0f%%, %d blocks loaded; outputs %s\n",
			cold.TTFTms, 100*cold.ExtHitRate, cold.BlocksLoaded, verdict)
	}
	if restarted != nil {
		verdict := "identical to the run without a connector"
		if k, ok := sameOutputs(all[0][0].stats, restarted.stats); !ok {
			verdict = fmt.Sprintf("DIFFERENT from the run without a connector (session %d turn %d)", k.Session, k.Turn)
		}
		printRestart(out, *restarted, restartTiers, verdict)
	}
	if pd != nil {
		printPD(out, runs[0], *pd, pdProcs)
	}
	if tp != nil {
		printTP(out, o, runs[3], *tp)
	}
	if n := corrupt(all); n > 0 {
		fmt.Fprintf(out, "\nverification failures: %d loaded blocks failed verification and were recomputed\n", n)
	}
	if identical {
		fmt.Fprintln(out, "\noutputs identical: yes (every generated token, connector on vs off)")
		o.keepUp(ctx, errw)
		return nil
	}
	fmt.Fprintf(out, "\noutputs identical: NO: %s\n", strings.Join(diff, "; "))
	return errors.New("outputs differ between connector on and off")
}

// Verdict says whether one run's outputs equal those of the first run
// without a connector (-json's verdicts: one per run and repeat).
type Verdict struct {
	Name      string `json:"name"`
	Repeat    int    `json:"repeat"` // from 1
	Identical bool   `json:"identical"`
	Differs   string `json:"differs,omitempty"` // the first session and turn that differs
}

// corrupt returns the loaded blocks of every run that failed verification.
func corrupt(all [][]Run) int64 {
	var n int64
	for _, rs := range all {
		for _, r := range rs {
			n += r.Corrupt
		}
	}
	return n
}

// coldStart runs the workload on one instance with the connector on, then
// runs it again on a brand-new instance over the same store: the new
// instance's KV pool is empty, so every hit comes from the store.
func coldStart(ctx context.Context, o Options) (Run, error) {
	o = o.forRun()
	st, closeStore, err := o.newStore()
	if err != nil {
		return Run{}, err
	}
	defer closeStore()
	mk := func() (*Engine, error) {
		cfg := o.engineConfig(0, o.Blocks)
		cfg.Store, cfg.Connector = st, o.connectorConfig()
		return NewEngine(cfg)
	}
	first, err := mk()
	if err != nil {
		return Run{}, err
	}
	_, err = run(ctx, []*Engine{first}, o.Workload, func(int, int) int { return 0 }, hooks{wait: o.Wait}, nil)
	first.Close()
	if err != nil {
		return Run{}, err
	}
	second, err := mk()
	if err != nil {
		return Run{}, err
	}
	defer second.Close()
	s, err := run(ctx, []*Engine{second}, o.Workload, func(int, int) int { return 0 }, hooks{wait: o.Wait}, nil)
	if err != nil {
		return Run{}, err
	}
	return newRun("cold start", true, o.Blocks, s), nil
}

// runPD runs the workload on a prefill instance and a decode instance in
// one process: each turn's prompt is prefilled on the first, which keeps
// the blocks and returns transfer parameters; the second reads the blocks
// straight into its own over the loopback transfer engine, computes the
// last prompt token and generates the turn's tokens.
func runPD(ctx context.Context, o Options) (Run, error) {
	fabric := rdma.NewFabric()
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	open := func(name string, role connector.Role) (*Engine, error) {
		te, err := fabric.NewEngine(name, nil)
		if err != nil {
			return nil, err
		}
		closers = append(closers, te.Close)
		env := connector.Env{Identity: o.identity(0)}
		s, ws, err := p2p.New(connector.Config{Connector: p2p.Name, Role: role}, env, te)
		if err != nil {
			return nil, err
		}
		cfg := o.engineConfig(0, o.Blocks)
		cfg.Conn, cfg.Worker = s, ws[0]
		e, err := NewEngine(cfg)
		if err != nil {
			s.Close()
			ws[0].Close()
			return nil, err
		}
		closers = append(closers, e.Close)
		return e, nil
	}
	prefill, err := open("prefill", connector.RoleProducer)
	if err != nil {
		return Run{}, err
	}
	decode, err := open("decode", connector.RoleConsumer)
	if err != nil {
		return Run{}, err
	}
	st, err := run(ctx, []*Engine{decode}, o.Workload, func(int, int) int { return 0 }, hooks{prefill: prefill, wait: o.Wait}, nil)
	if err != nil {
		return Run{}, err
	}
	return newRun("prefill/decode", true, o.Blocks, st), nil
}

// printPD prints the prefill/decode runs beside one instance without a
// connector: in one process, and across processes when procs is not nil.
func printPD(out io.Writer, off, pd Run, procs *Run) {
	cols := []Run{off, pd}
	head := []string{"single", "P/D 1 proc"}
	if procs != nil {
		cols = append(cols, *procs)
		head = append(head, "P/D 2 procs")
	}
	if procs == nil {
		fmt.Fprintf(out, "\nprefill/decode over the p2p connector, in one process (loopback transfer engine), beside one instance without a connector:\n")
	} else {
		fmt.Fprintf(out, "\nprefill/decode over the p2p connector, in one process (loopback transfer engine) and as two processes (%s), beside one instance without a connector:\n", procs.Transfer)
	}
	row := func(name string, f func(i int, r Run) string) {
		fmt.Fprintf(out, "%-26s |", name)
		for i, r := range cols {
			fmt.Fprintf(out, " %11s", f(i, r))
		}
		fmt.Fprintln(out)
	}
	num := func(format string, f func(Run) float64) func(int, Run) string {
		return func(_ int, r Run) string { return fmt.Sprintf(format, f(r)) }
	}
	kv := func(format string, f func(Run) float64) func(int, Run) string {
		return func(i int, r Run) string {
			if i == 0 {
				return "-"
			}
			return fmt.Sprintf(format, f(r))
		}
	}
	row("", func(i int, _ Run) string { return head[i] })
	row("success / failed", func(_ int, r Run) string { return fmt.Sprintf("%d/%d", r.Succeeded, r.Failed) })
	row("duration (s)", num("%.2f", func(r Run) float64 { return r.Seconds }))
	row("mean TTFT (ms)", num("%.1f", func(r Run) float64 { return r.TTFTms }))
	row("mean TPOT (ms)", num("%.2f", func(r Run) float64 { return r.TPOTms }))
	row("mean request latency (ms)", num("%.1f", func(r Run) float64 { return r.Latencyms }))
	row("KV transferred (MiB)", kv("%.1f", func(r Run) float64 { return float64(r.LoadBytes) / (1 << 20) }))
	row("blocks transferred", kv("%.0f", func(r Run) float64 { return float64(r.BlocksLoaded) }))
	if procs != nil && procs.Lost != "" {
		fmt.Fprintf(out, "the %s instance ended mid-run; the decode instance computed %d requests itself\n", procs.Lost, procs.Rerouted)
	}
}

// printTP prints the connector-on run with the ranks as processes beside
// the same run with the ranks in this process.
func printTP(out io.Writer, o Options, in, procs Run) {
	fmt.Fprintf(out, "\n%d tensor-parallel ranks, connector on, eviction pressure: in this process, and as %d processes (Metadata and Outputs encoded over unix sockets, the store served on one):\n", o.TP, o.TP)
	row := func(name, format string, f func(Run) float64) {
		fmt.Fprintf(out, "%-26s | "+format+" "+format+"\n", name, f(in), f(procs))
	}
	fmt.Fprintf(out, "%-26s | %11s %11s\n", "", "in-process", "processes")
	fmt.Fprintf(out, "%-26s | %11s %11s\n", "success / failed", fmt.Sprintf("%d/%d", in.Succeeded, in.Failed), fmt.Sprintf("%d/%d", procs.Succeeded, procs.Failed))
	row("duration (s)", "%11.2f", func(r Run) float64 { return r.Seconds })
	row("mean TTFT (ms)", "%11.1f", func(r Run) float64 { return r.TTFTms })
	row("mean TPOT (ms)", "%11.2f", func(r Run) float64 { return r.TPOTms })
	row("KV hit rate, total", "%10.1f%%", func(r Run) float64 { return 100 * (r.LocalHitRate + r.ExtHitRate) })
	row("blocks loaded", "%11.0f", func(r Run) float64 { return float64(r.BlocksLoaded) })
	row("blocks saved", "%11.0f", func(r Run) float64 { return float64(r.BlocksSaved) })
	if t := procs.tp; t != nil && len(t.lost) > 0 {
		fmt.Fprintf(out, "%d rank processes ended mid-run and were replaced; %d steps were abandoned and their requests recomputed:\n", len(t.lost), t.steps)
		for _, l := range t.lost {
			fmt.Fprintf(out, "  %s\n", l)
		}
	}
}

func printTable(out io.Writer, o Options, runs []Run) {
	w := o.Workload
	fmt.Fprintf(out, "kvconnect mini-engine: %d sessions x %d turns, system %d + first turn %d tokens, +%d per turn, %d output tokens\n",
		w.Sessions, w.Turns, w.System, w.FirstTurn, w.Growth, w.Output)
	storeName := "embedded memstore"
	if o.Store == "mooncake" {
		storeName = "Mooncake Store"
	}
	if o.Store == "tiered" {
		storeName = o.Tiered.describe(o.StoreBytes)
	}
	if o.Kind == "hybrid" {
		fmt.Fprintf(out, "model: hybrid, %d layers (sliding-window attention over %d tokens, full attention, gated linear recurrence, in turn), dim %d, %d heads, float32; KV blocks of %d tokens; store: %s",
			o.Model.Layers, o.Window, o.Model.Dim, o.Model.Heads, o.Block, storeName)
	} else {
		fmt.Fprintf(out, "model: %d layers, dim %d, %d heads, float32; KV blocks of %d tokens; store: %s", o.Model.Layers, o.Model.Dim, o.Model.Heads, o.Block, storeName)
	}
	if o.Instances > 1 {
		fmt.Fprintf(out, ", shared by %d instances", o.Instances)
	}
	fmt.Fprintln(out)
	if o.Kind == "hybrid" {
		a, b := o.groupBlocks(o.Blocks), o.groupBlocks(o.PressureBlocks)
		fmt.Fprintf(out, "a pool per KV cache group, full attention / sliding window / state: %d/%d/%d blocks, under pressure %d/%d/%d\n", a[0], a[1], a[2], b[0], b[1], b[2])
	}
	fmt.Fprintf(out, "\n%-26s | %-30s | %-30s\n", "", fmt.Sprintf("no pressure (%d blocks)", o.Blocks), fmt.Sprintf("eviction pressure (%d blocks)", o.PressureBlocks))
	fmt.Fprintf(out, "%-26s | %9s %9s %10s | %9s %9s %10s\n", "", "OFF", "ON", "ON vs OFF", "OFF", "ON", "ON vs OFF")
	row := func(name string, f func(Run) float64, format string, ratio bool) {
		fmt.Fprintf(out, "%-26s |", name)
		for i := 0; i+1 < len(runs); i += 2 {
			a, b := f(runs[i]), f(runs[i+1])
			fmt.Fprintf(out, " "+format+" "+format, a, b)
			switch {
			case !ratio:
				fmt.Fprintf(out, " %10s |", "")
			case a == 0:
				fmt.Fprintf(out, " %10s |", "-")
			default:
				fmt.Fprintf(out, " %9.2fx |", b/a)
			}
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintf(out, "%-26s |", "success / failed")
	for i, r := range runs {
		fmt.Fprintf(out, " %9s", fmt.Sprintf("%d/%d", r.Succeeded, r.Failed))
		if i%2 == 1 {
			fmt.Fprintf(out, " %10s |", "")
		}
	}
	fmt.Fprintln(out)
	row("duration (s)", func(r Run) float64 { return r.Seconds }, "%9.2f", true)
	row("requests/s", func(r Run) float64 { return r.RequestsPerS }, "%9.2f", true)
	row("tokens/s", func(r Run) float64 { return r.TokensPerS }, "%9.0f", true)
	row("mean TTFT (ms)", func(r Run) float64 { return r.TTFTms }, "%9.1f", true)
	row("mean TPOT (ms)", func(r Run) float64 { return r.TPOTms }, "%9.2f", true)
	row("subsequent-turn TTFT (ms)", func(r Run) float64 { return r.LaterTTFTms }, "%9.1f", true)
	row("KV hit rate, local", func(r Run) float64 { return 100 * r.LocalHitRate }, "%8.1f%%", false)
	row("KV hit rate, external", func(r Run) float64 { return 100 * r.ExtHitRate }, "%8.1f%%", false)
	row("KV hit rate, total", func(r Run) float64 { return 100 * (r.LocalHitRate + r.ExtHitRate) }, "%8.1f%%", false)
	row("tokens computed", func(r Run) float64 { return float64(r.Computed) }, "%9.0f", true)
	row("blocks loaded", func(r Run) float64 { return float64(r.BlocksLoaded) }, "%9.0f", false)
	if o.Store == "tiered" {
		row("tokens loaded from RAM", func(r Run) float64 { return float64(r.stats.ConnLoadTokens.CPU) }, "%9.0f", false)
		row("tokens loaded from disk", func(r Run) float64 { return float64(r.stats.ConnLoadTokens.Disk) }, "%9.0f", false)
	}
	row("blocks saved", func(r Run) float64 { return float64(r.BlocksSaved) }, "%9.0f", false)
	row("connector time (ms)", func(r Run) float64 { return r.ConnectorMs }, "%9.1f", false)
	row("idle steps / request", func(r Run) float64 { return r.IdleSteps }, "%9.1f", false)
}
