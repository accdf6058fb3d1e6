package connectortest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// Pair is the two halves of a connector: one scheduler half and one worker
// half per tensor-parallel rank, in rank order.
type Pair struct {
	Planner connector.Planner
	Workers []connector.Worker

	// Close, when not nil, releases what the OpenFunc opened for the pair
	// besides its halves (transfer engines, say). The harness calls it
	// once, after it closed both halves.
	Close func() error

	// Alloc, when not nil, allocates n bytes of host memory for the KV
	// cache of rank, instead of rdma.AllocHost: for transfer engines that
	// register only memory of their own, such as rdma/shm's
	// (shm.Engine.Alloc). The harness frees it after Close.
	Alloc func(rank, n int) (Memory, error)
}

// Memory is host memory for a worker's KV cache, from Pair.Alloc: the
// harness writes and reads it through Bytes, registers Region with the
// worker, and frees it once the pair is closed. *rdma.HostMemory and
// *shm.Memory are Memory.
type Memory interface {
	Region() rdma.Region
	Bytes() []byte
	Free() error
}

var _ Memory = (*rdma.HostMemory)(nil)

// OpenFunc opens a connector pair: the scheduler half, and one worker half
// for each rank 0 to env.Identity.Layout.TPSize-1 (with env.Rank set to
// that rank).
//
// cfg holds what the harness chooses for the pair: its LoadFailurePolicy
// (recompute or fail, drawn for each test case). OpenFunc fills in the
// connector's own fields (Connector, Role, Extra) and opens both halves
// with cfg: the harness checks every LoadFailure.Fail against the policy
// it asked for. env.Store is the store the pair must use; env.Blocks is
// the engine's number of KV blocks. The harness registers the workers' KV
// memory and closes the pair: each half twice, then Pair.Close. With an
// error, it closes the halves the Pair holds and fails the test.
type OpenFunc func(cfg connector.Config, env connector.Env) (Pair, error)

// Options select what Run exercises, and say what it needs.
type Options struct {
	// NewStore returns a new, empty store for one test case. It is
	// required. The harness wraps it and closes it. The wrapper records
	// what the store really holds: a match may claim only blocks that a
	// put stored in every shard, and must claim every block puts had
	// stored before the request's first Match (Run skips that check once
	// the store evicted keys), a KV event (connector.EventSource) may
	// announce only those, and the worker halves' Stats.Saves must add up
	// to the keys their puts stored. So a connector must key block h of
	// shard s as Namespace.Key(s, h) of package hashing (the keys that
	// routers and other engines compute), or as values of ranges of its
	// layers under Namespace.LayerKey, and save each block of each shard
	// once (one replica of a shard saves it). The wrapper also fails
	// the puts and gets that some subtests pick.
	NewStore func() (store.Store, error)

	// NoFaults runs without injected store faults: the state machine
	// never wraps the store in a storetest.Faulty, and the LoadFailure and
	// Shards subtests, which fail chosen puts and gets, are skipped. By
	// default half of the state machine's cases run over a Faulty that
	// fails calls and keys at random, makes keys vanish between an exists
	// and a get, scribbles over the destination of a failed get, and
	// answers puts with out-of-space.
	NoFaults bool

	// Groups says that the connector supports KV cache groups
	// (hashing.Layout.Groups) at the layout's block size: Run then also
	// runs the Groups subtests, and hybrid cases in the state machine, with
	// a layout of one full-attention, one sliding-window and one state
	// group. Without it, the NoGroups subtest checks that opening a pair
	// for such a layout fails with an error wrapping connector.ErrConfig:
	// a connector refuses at open what it cannot serve.
	Groups bool

	// NoRotation skips generation rotation, for a connector whose
	// scheduler half does not implement connector.Rotator: no Rotation
	// subtest, no rotations in the state machine.
	NoRotation bool

	// OpenConsumer, when set, makes Run check a connector for
	// disaggregated prefill and decode instead of one that shares KV
	// through a store: open opens the producer's pair (the prefill
	// instance) and OpenConsumer the consumer's (the decode instance). The
	// producer's scheduler half must implement
	// connector.TransferParamsSource; the consumer receives its parameters
	// in Request.TransferParams. The checks that read the store are not
	// made.
	OpenConsumer OpenFunc

	// ConsumerProcess, with OpenConsumer, runs every consumer pair in a
	// child process of the test binary, so that the producer and the
	// consumer share nothing but the bytes of the transfer parameters,
	// which the harness hands over through a pipe: a connector whose
	// consumer reaches the producer's offers or memory through its own
	// process (a package-level registry, say) fails. Run then runs the
	// CrossProcess subtests alone (the Handoff cases, each with its own
	// consumer process, and WrongParams, with two), not the in-process
	// ones: run it twice, with and
	// without. The child runs, alone (-test.run), the test that called
	// Run, whose Run then drives the consumer's engine: that test must
	// reach Run with the same Options there, and the pairs' transfer
	// engines must reach across processes (rdma/shm, or rdma/mooncake;
	// not rdma.Loopback).
	ConsumerProcess bool

	// Gate, with OpenConsumer, holds the consumer's transfers: wrap the
	// consumer pair's transfer engines with Gate.Engine in OpenConsumer,
	// and Run adds the CloseInFlight subtest, which closes the consumer's
	// halves while their loads wait in the gate. Not used with
	// ConsumerProcess (the consumer is in another process).
	Gate *Gate

	// gaveUp, set by Run, holds what the first wait that reached
	// waitBound waited for: later cases then fail at once, rather than
	// wait out the bound again (and again as rapid shrinks).
	gaveUp *string
}

// Run checks that a connector keeps the promises of package connector,
// driving it from a model engine with paged KV memory in which every block
// has known bytes. For a connector that shares KV through a store it runs
// these subtests:
//
//   - SharedPrefix: a prompt computed and saved by one request is matched,
//     loaded and byte-identical for a later one after local eviction, for
//     every shard; the last prompt token is never matched.
//   - LoadFailure: under each policy, a load of which one block of one
//     shard fails is reported failed with Valid up to that block and Fail
//     as the policy says; nothing writes the failed blocks afterwards.
//   - Shards: with a block stored for one shard only, a match stops before
//     it, although the other shard's load of it would fail cleanly.
//   - Rotation: after Rotate, no block of the old generation is matched,
//     and what the workers saved is read back by a fresh engine of the new
//     generation; a rotation to the current generation is refused.
//   - Layouts: an engine of another layout on the same store matches none
//     of the blocks the first saved.
//   - Health, WrongValue: see the package doc.
//   - LayerWise, LayerCancel (where the workers are
//     connector.LayerWorkers): loads and saves layer by layer; a WaitLayer
//     whose context is canceled, or passes its deadline, while the
//     layer's loads run returns the context's error, and the loads still
//     end, byte for byte.
//   - RealSize: blocks of 256 KiB to 1 MiB per rank, in 4 to 8 layers,
//     loaded byte for byte with no load failed.
//   - CloseInFlight: Close of both halves while 256 KiB loads and saves
//     run returns, and nothing writes KV memory after it did.
//   - Groups (with Options.Groups): with a hybrid layout (one
//     full-attention, one sliding-window and one state group), a saved
//     prompt is matched and loaded again, from the store alone and after a
//     local hit; a match stops where a block of the window before it is
//     missing, and ends only where some engine kept the state; a state
//     that fails to load leaves only the local hit valid.
//   - NoGroups (without Options.Groups): opening a pair for the hybrid
//     layout fails with an error wrapping connector.ErrConfig.
//   - StateMachine: a rapid state machine over two engines sharing one
//     store (of different tenants, of one tenant and different layouts,
//     or of one identity): requests sharing prefixes, chunked prefill and
//     decode, local evictions, preemption, finishes, generation rotations
//     and store faults; at the end of each case a fresh engine of each
//     identity, in its current generation, reads back the prompts its
//     engine ran.
//
// Every subtest checks, step by step: every loaded block holds exactly the
// bytes saved for its key, in every rank; Metadata names each request's
// own blocks and hashes; with KV cache groups, a match ends where every
// group can resume (full attention: every block before it; a sliding
// window of W tokens: the blocks holding the W-1 tokens before it; a state
// group: the state after the block before it), a load names exactly the
// entries resuming there needs beyond the local hit and no other, every
// one of them then holds the saved bytes of its group, block and state
// position, and no other block of the request was written; a block nothing may write (free, not yet
// computed, or whose load was reported failed) is never written; a save
// reads a block only after the step's ready event fired (the engine writes
// the step's KV in two halves and fires the events only once every worker
// with such a save waits on its event or has finished it); matches never
// cover the last prompt token, claim only blocks the store holds in
// every shard, and are the longest the store held before the request's
// first Match (unless a store fault, a failed load, a failed lookup or an
// eviction excuses a shorter one); KV events announce only blocks the
// store holds; Loaded and
// Failed come only once every worker reported the load, Failed with Valid
// up to the first block any worker failed, Fail as the policy says. At
// the end of each case: every kept block is released, Stats (where a half
// implements connector.StatsReporter) agree with what the engine saw, each
// half's second Close returns nil, and no goroutine of the connector's
// packages is left.
//
// For a disaggregated connector (Options.OpenConsumer) it runs Handoff (a
// prompt prefilled on the producer is loaded byte for byte by the
// consumer from the parameters the producer hands on), RealSize (Handoff
// with blocks of real size), CloseInFlight (with Options.Gate: the
// consumer's halves close while its loads of 256 KiB blocks wait in the
// gate, and nothing writes KV memory once Close returned), WrongParams
// (parameters tampered with on their way load nothing; see the package
// doc) and a StateMachine
// of prefills, handoffs in any order, consumer requests with and without
// parameters, preemption and local eviction on the consumer, with the same
// checks except those that read the store.
//
// With Options.ConsumerProcess it runs CrossProcess instead: the Handoff
// cases with two prompts sharing a prefix, each case's consumer engine
// driven in a child process of the test binary that gets only the
// prompts and their transfer parameters, checks every block it loads as
// the other subtests do, and reports its matches and loads; the producer
// must then release the offers. Its WrongParams hands one consumer process
// every kind of tampered parameters, which must load nothing, and another
// the genuine ones.
//
// Nothing depends on the speed of the machine: where the harness waits for
// a connector's background work it waits for the condition, failing after
// a minute with what it waited for; where nothing is in flight and the
// connector still holds blocks, it fails within 100 steps, at once.
func Run(t *testing.T, open OpenFunc, opts Options) {
	t.Helper()
	if opts.NewStore == nil {
		t.Fatal("connectortest: Options.NewStore is nil")
	}
	opts.gaveUp = new(string)
	if opts.Gate != nil && (opts.OpenConsumer == nil || opts.ConsumerProcess) {
		t.Fatal("connectortest: Options.Gate is set without Options.OpenConsumer, or with Options.ConsumerProcess: it holds the transfers of a consumer in this process")
	}
	if opts.ConsumerProcess {
		if opts.OpenConsumer == nil {
			t.Fatal("connectortest: Options.ConsumerProcess is set without Options.OpenConsumer")
		}
		switch serve, other := servesConsumer(t.Name()); {
		case serve:
			serveConsumer(t, opts)
		case other:
			t.Skipf("in the consumer process of %s", os.Getenv(consumerEnv))
		default:
			runCrossProcess(t, open, opts)
		}
		return
	}
	if opts.OpenConsumer != nil {
		runDisaggregated(t, open, opts)
		return
	}
	shapes := [][2]int{{1, 1}, {2, 1}, {2, 2}}
	t.Run("SharedPrefix", func(t *testing.T) {
		for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
			for _, tp := range shapes {
				t.Run(fmt.Sprintf("%v/tp%d-repl%d", order, tp[0], tp[1]), func(t *testing.T) {
					sharedPrefix(t, open, opts, order, tp[0], tp[1])
				})
			}
		}
	})
	if !opts.NoFaults {
		t.Run("LoadFailure", func(t *testing.T) {
			for _, policy := range []connector.Policy{connector.PolicyRecompute, connector.PolicyFail} {
				for _, tp := range shapes {
					t.Run(fmt.Sprintf("%s/tp%d-repl%d", policy, tp[0], tp[1]), func(t *testing.T) {
						loadFailure(t, open, opts, policy, tp[0], tp[1])
					})
				}
			}
		})
		t.Run("Shards", func(t *testing.T) { shards(t, open, opts) })
	}
	t.Run("Health", func(t *testing.T) { health(t, open, opts) })
	t.Run("WrongValue", func(t *testing.T) {
		for _, l := range lies {
			for _, c := range []struct {
				order connector.Order
				tp    int
			}{{connector.BlockMajor, 1}, {connector.LayerMajor, 2}} {
				t.Run(fmt.Sprintf("%s/%v/tp%d", lieName(l), c.order, c.tp), func(t *testing.T) {
					wrongValue(t, open, opts, l, c.order, c.tp)
				})
			}
		}
	})
	if !opts.NoRotation {
		t.Run("Rotation", func(t *testing.T) { rotation(t, open, opts) })
	}
	t.Run("Layouts", func(t *testing.T) { layouts(t, open, opts) })
	t.Run("LayerWise", func(t *testing.T) {
		for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
			t.Run(order.String(), func(t *testing.T) { layerWise(t, open, opts, order) })
		}
	})
	t.Run("LayerCancel", func(t *testing.T) {
		for _, how := range []cancelHow{cancelCancel, cancelDeadline} {
			for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
				t.Run(fmt.Sprintf("%s/%v", how, order), func(t *testing.T) { layerCancel(t, open, opts, how, order) })
			}
		}
	})
	t.Run("RealSize", func(t *testing.T) {
		for _, c := range realSizes {
			t.Run(c.name(), func(t *testing.T) { realSize(t, open, opts, c) })
		}
	})
	t.Run("CloseInFlight", func(t *testing.T) { closeInFlight(t, open, opts) })
	if opts.Groups {
		t.Run("Groups", func(t *testing.T) { groups(t, open, opts) })
	} else {
		t.Run("NoGroups", func(t *testing.T) { refusesGroups(t, open, opts) })
	}
	t.Run("StateMachine", func(t *testing.T) {
		var c counts
		rapid.Check(t, func(t *rapid.T) { stateMachine(t, open, opts, &c) })
		c.log(t)
	})
}

// runDisaggregated checks a producer/consumer pair of connectors.
func runDisaggregated(t *testing.T, open OpenFunc, opts Options) {
	t.Run("Handoff", func(t *testing.T) {
		for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
			for _, tp := range [][2]int{{1, 1}, {2, 1}, {2, 2}} {
				t.Run(fmt.Sprintf("%v/tp%d-repl%d", order, tp[0], tp[1]), func(t *testing.T) {
					handoff(t, open, opts, order, tp[0], tp[1])
				})
			}
		}
	})
	t.Run("RealSize", func(t *testing.T) {
		for _, c := range realSizes {
			if !c.layered {
				t.Run(c.name(), func(t *testing.T) { handoffRealSize(t, open, opts, c) })
			}
		}
	})
	if opts.Gate != nil {
		t.Run("CloseInFlight", func(t *testing.T) { handoffCloseInFlight(t, open, opts) })
	}
	t.Run("WrongParams", func(t *testing.T) {
		for _, l := range paramLies {
			t.Run(l.String(), func(t *testing.T) { wrongParams(t, open, opts, l) })
		}
	})
	if !opts.Groups {
		t.Run("NoGroups", func(t *testing.T) { refusesGroups(t, open, opts) })
	}
	t.Run("StateMachine", func(t *testing.T) {
		var c counts
		rapid.Check(t, func(t *rapid.T) { disaggregatedMachine(t, open, opts, &c) })
		c.log(t)
	})
}

// testPrompt returns a prompt of n tokens from base on.
func testPrompt(n, base int) []hashing.Token {
	p := make([]hashing.Token, n)
	for i := range p {
		p[i] = hashing.Token(base + i)
	}
	return p
}

// hashesOf returns the block hashes of prompt in blocks of bs tokens.
func hashesOf(t tb, prompt []hashing.Token, bs int) []hashing.BlockHash {
	t.Helper()
	c, err := hashing.NewChain(bs)
	if err != nil {
		t.Fatalf("NewChain: %v", err)
	}
	return c.Append(nil, prompt...)
}

func sharedPrefix(t *testing.T, open OpenFunc, opts Options, order connector.Order, tp, repl int) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	e := w.open(spec{label: "t0", open: open, tenant: "tenant0", order: order, tp: tp, repl: repl, bs: bs, blocks: 64})
	// A prompt of exactly 6 blocks: the match must stop short of the last
	// token, so at most 5 blocks load.
	prompt := testPrompt(6*bs, 1000)
	e.add(prompt, 2)
	w.drain(e)
	e.dropCache()
	before := e.stats.externalHits
	e.add(prompt, 2)
	w.drain(e)
	w.expectHits(e, e.stats.externalHits-before, 5, "the second request of a saved 6-block prompt", "all but the block with the last prompt token")
	if e.stats.loads == 0 && e.storeFailure() == "" {
		t.Errorf("no load finished")
	}
	w.finish()
}

// layerWise checks a connector whose workers are connector.LayerWorkers,
// driven layer by layer: a prompt computed and saved layer by layer loads
// back byte-exact, WaitLayer of a step that loads does not return while
// the store holds every get, and SaveLayer of a layer hands the store no
// later layer before it is computed (see engine.computeLayers).
func layerWise(t *testing.T, open OpenFunc, opts Options, order connector.Order) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	e := w.open(spec{label: "t0", open: open, tenant: "tenant0", order: order, tp: 2, repl: 1, bs: bs, blocks: 64, layered: true, probe: true})
	if e.layered == nil {
		t.Skip("the workers are not connector.LayerWorkers")
	}
	prompt := testPrompt(6*bs, 9000)
	e.add(prompt, 2)
	w.drain(e)
	if e.probeSaves {
		t.Fatalf("no step saved a block: the prompt's saves were never probed")
	}
	e.dropCache()
	before := e.stats.externalHits
	e.add(prompt, 2)
	w.drain(e)
	if e.probeLoads {
		t.Fatalf("no step loaded a block: the loads were never probed")
	}
	w.expectHits(e, e.stats.externalHits-before, 5, "the second request of a 6-block prompt saved layer by layer", "all but the block with the last prompt token")
	w.finish()
}

// layerCancel checks a connector whose workers are connector.LayerWorkers
// against a WaitLayer whose context ends while the layer's loads run: a
// prompt of 136 blocks in 2 ranks (270 keys in one step's loads) is saved,
// and loaded again with the store holding every get while WaitLayer(0)
// runs, its context canceled (or past its deadline) once a get arrived.
// Each WaitLayer must return the context's error (see engine.cancelWait);
// the step then waits on layer 0 again, and the loads must end, each
// reported once, every block byte for byte; Close leaves no goroutine.
func layerCancel(t *testing.T, open OpenFunc, opts Options, how cancelHow, order connector.Order) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 2
	e := w.open(spec{label: "t0", open: open, tenant: "tenant0", order: order, tp: 2, repl: 1, bs: bs, blocks: 160, layered: true, cancel: how})
	if e.layered == nil {
		t.Skip("the workers are not connector.LayerWorkers")
	}
	prompt := testPrompt(136*bs, 21000)
	e.add(prompt, 1)
	w.drain(e)
	e.dropCache()
	before := e.stats.externalHits
	e.add(prompt, 1)
	w.drain(e)
	if e.cancel != cancelNone {
		if f := e.storeFailure(); f != "" {
			t.Skipf("no step loaded a block, as a lookup failed (%s): a miss is correct then, and no WaitLayer had loads to cancel", f)
		}
		t.Fatalf("no step loaded a block: no WaitLayer was canceled")
	}
	w.expectHits(e, e.stats.externalHits-before, 135, "the second request of a saved 136-block prompt", "all but the block with the last prompt token")
	if e.stats.loads == 0 && e.storeFailure() == "" {
		t.Errorf("no load finished after the canceled WaitLayer")
	}
	w.finish()
}

// realSize is the shape of a RealSize subtest: KV blocks of real size.
type realSizeCase struct {
	order      connector.Order
	tp         int
	layers     int
	blockBytes int // per layer, K or V, per rank
	layered    bool
}

func (c realSizeCase) name() string {
	s := fmt.Sprintf("%v/tp%d/%dKiB", c.order, c.tp, c.layers*2*c.blockBytes>>10)
	if c.layered {
		s += "/layered"
	}
	return s
}

// realSizes are blocks of 256 KiB to 1 MiB per rank, as real KV blocks
// are, in 4 to 8 layers; a prompt of 6 blocks stores at most 6 MiB.
var realSizes = []realSizeCase{
	{order: connector.BlockMajor, tp: 1, layers: 8, blockBytes: 64 << 10},
	{order: connector.LayerMajor, tp: 2, layers: 4, blockBytes: 32 << 10},
	{order: connector.LayerMajor, tp: 2, layers: 4, blockBytes: 32 << 10, layered: true},
}

// realSize checks loads and saves of KV blocks of real size, byte for
// byte, every layer of every rank, in blocks of 16 tokens: nothing the
// connector does may hold only for small values (a buffer of a fixed
// size, an offset that wraps, a pattern that repeats).
func realSize(t *testing.T, open OpenFunc, opts Options, c realSizeCase) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 16
	e := w.open(spec{label: "t0", open: open, tenant: "tenant0", order: c.order, tp: c.tp, repl: 1, bs: bs, blocks: 14, layers: c.layers, blockBytes: c.blockBytes, layered: c.layered})
	if c.layered && e.layered == nil {
		t.Skip("the workers are not connector.LayerWorkers")
	}
	prompt := testPrompt(6*bs, 23000)
	e.add(prompt, 2)
	w.drain(e)
	e.dropCache()
	before := e.stats
	e.add(prompt, 2)
	w.drain(e)
	w.expectHits(e, e.stats.externalHits-before.externalHits, 5, fmt.Sprintf("the second request of a saved 6-block prompt, in blocks of %d bytes per rank", c.layers*2*c.blockBytes), "all but the block with the last prompt token")
	if f := e.stats.failedLoads - before.failedLoads; f > 0 && e.storeFailure() == "" && w.base.Stats().Evictions == 0 {
		t.Fatalf("%d loads of a saved 6-block prompt, in blocks of %d bytes per rank, failed, with a store that failed no call and evicted nothing: the connector broke values of this size", f, c.layers*2*c.blockBytes)
	}
	if e.stats.loads == before.loads && e.storeFailure() == "" {
		t.Errorf("no load finished")
	}
	w.finish()
}

// closeInFlight checks Close of both halves while large loads and saves
// run: KV blocks of 256 KiB per rank, a prompt of 8 blocks loading (the
// store holds its gets) and two of 3 blocks just computed, their saves
// under way. Close must return (the harness lets the held gets go once it
// did, or a while after it began, for a Close that waits for running
// transfers), and once it returned nothing may write KV memory: the
// harness keeps a copy of every rank's memory, waits until no get is in
// the store and no goroutine of the connector runs, and compares. Then
// each half's next Close returns nil, the memory is freed (a transfer
// still reading it would crash the test), and no goroutine is left.
func closeInFlight(t *testing.T, open OpenFunc, opts Options) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 16
	e := w.open(spec{label: "t0", open: open, tenant: "tenant0", order: connector.LayerMajor, tp: 2, repl: 1, bs: bs, blocks: 24, layers: 4, blockBytes: 32 << 10})
	saved := testPrompt(8*bs, 25000)
	e.add(saved, 0)
	w.drain(e)
	e.dropCache()
	// Two prompts compute in one step and finish, their saves under way.
	e.add(testPrompt(3*bs, 26000), 0)
	e.add(testPrompt(3*bs, 27000), 0)
	e.step(context.Background(), 0)
	// The saved prompt loads, every get held in the store.
	w.rec.holdGets()
	defer w.rec.releaseGets()
	e.add(saved, 0)
	r := e.reqs[len(e.reqs)-1]
	start := time.Now()
	var p pause
	for reached, _ := w.rec.heldSince(); reached == 0; reached, _ = w.rec.heldSince() {
		if r.phase == running || r.phase == done {
			if f := e.storeFailure(); f != "" && r.loadN == 0 {
				t.Skipf("the request for a saved 8-block prompt matched nothing, as a lookup failed (%s): a miss is correct then, and no load was in flight at Close", f)
			}
			t.Fatalf("the request for a saved 8-block prompt ran with no get reaching the store (%d blocks matched): a load was to be in flight at Close", r.loadN)
		}
		if time.Since(start) > waitBound {
			w.gaveUp("no get of the load of a saved 8-block prompt reached the store in %v; %s", waitBound, e.describe())
		}
		e.step(context.Background(), 0)
		p.sleep()
	}
	w.closeHeld(e, w.rec.releaseGets, "loads")
	w.closed = true
	e.close(true)
	if err := w.base.Close(); err != nil {
		t.Fatalf("close the store: %v", err)
	}
	w.checkGoroutines()
}

// closeHeld closes both halves of e, as an engine shutting down does,
// while its loads wait where the harness holds them (in the store or in
// Options.Gate); release lets them go, for a Close that waits for running
// transfers: once Close has run for probeGrace and its goroutine waits
// (blocked, not running, runnable or in a system call, at two looks in a
// row), so that a Close that returns at once returns before, however
// slowly the machine schedules it; or after closeFallback, for a Close
// that waits in a way that looks busy. It then checks
// that nothing writes e's KV memory once Close returned.
func (w *world) closeHeld(e *engine, release func(), what string) {
	t := w.t
	t.Helper()
	closed := make(chan error, 1)
	closing := make(chan uint64, 1)
	go func() {
		closing <- currentGoroutine()
		var errs []error
		for rank, wk := range e.pair.Workers {
			if err := wk.Close(); err != nil {
				errs = append(errs, fmt.Errorf("worker %d: Close: %w", rank, err))
			}
		}
		if err := e.pair.Planner.Close(); err != nil {
			errs = append(errs, fmt.Errorf("scheduler half: Close: %w", err))
		}
		closed <- errors.Join(errs...)
	}()
	gid := <-closing
	start := time.Now()
	released := false
	looks := 0
	var err error
	var p pause
wait:
	for {
		select {
		case err = <-closed:
			break wait
		default:
		}
		// For a Close that waits for running transfers: once it waits
		// (seen at two looks in a row), or, for one that waits in a way
		// that looks busy (a system call, a spin), after closeFallback.
		if !released {
			el := time.Since(start)
			if el >= probeGrace && waitsOn(gid) {
				looks++
			} else {
				looks = 0
			}
			if looks >= 2 || el >= closeFallback {
				release()
				released = true
			}
		}
		if time.Since(start) > waitBound {
			w.gaveUp("Close of the halves had not returned %v after it began, with %s of 256 KiB blocks in flight: Close cancels what is queued and waits only for what runs", waitBound, what)
		}
		p.sleep()
	}
	if err != nil {
		t.Fatalf("%v", err)
	}
	snap := make([][]byte, len(e.mem))
	for i, m := range e.mem {
		snap[i] = bytes.Clone(m.Bytes())
	}
	release()
	w.settle()
	for i, m := range e.mem {
		if j := firstDiff(snap[i], m.Bytes()); j >= 0 {
			t.Fatalf("KV memory of rank %d (offset %d of %d bytes) was written after Close of both halves returned, with %s in flight at Close: Close cancels queued transfers and waits for running ones, and nothing writes the engine's memory once it returned", i, j, len(snap[i]), what)
		}
	}
}

// closeFallback is how long closeHeld holds the loads of a Close that
// never looks as if it waited.
const closeFallback = 10 * time.Second

// handoffCloseInFlight is CloseInFlight for a disaggregated connector:
// the consumer's halves close while its loads of 256 KiB blocks from the
// producer wait in Options.Gate.
func handoffCloseInFlight(t *testing.T, open OpenFunc, opts Options) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 16
	prod, cons := openPD(w, open, spec{tenant: "tenant0", order: connector.LayerMajor, tp: 2, repl: 1, bs: bs, blocks: 24, layers: 4, blockBytes: 32 << 10})
	prompt := testPrompt(8*bs, 25000)
	prod.add(prompt, 0)
	w.offersOf(1, prod)
	params := paramsOf(t, prod, prompt)
	prod.offers = prod.offers[:0]
	g := opts.Gate
	var kv []rdma.Region
	for _, m := range cons.mem {
		kv = append(kv, m.Region())
	}
	g.hold(kv)
	defer g.releaseAll()
	cons.addWith(prompt, 0, params)
	r := cons.reqs[len(cons.reqs)-1]
	start := time.Now()
	var p pause
	for g.heldSince() == 0 {
		if r.phase == running || r.phase == done {
			t.Fatalf("the consumer's request for an 8-block prompt the producer prefilled ran with no read into its KV memory reaching Options.Gate (%d blocks matched): a load was to be in flight at Close (are the consumer's transfer engines wrapped with Gate.Engine?)", r.loadN)
		}
		if time.Since(start) > waitBound {
			w.gaveUp("no read into KV memory of the consumer's load of an 8-block prompt reached Options.Gate in %v; %s", waitBound, cons.describe())
		}
		cons.step(context.Background(), 0)
		p.sleep()
	}
	w.closeHeld(cons, g.releaseAll, "loads")
	w.closed = true
	cons.close(true)
	prod.close(true)
	if err := w.base.Close(); err != nil {
		t.Fatalf("close the store: %v", err)
	}
	w.checkGoroutines()
}

// firstDiff returns the first offset at which a and b differ, or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

func loadFailure(t *testing.T, open OpenFunc, opts Options, policy connector.Policy, tp, repl int) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	e := w.open(spec{label: "t0", open: open, tenant: "tenant0", order: connector.LayerMajor, tp: tp, repl: repl, bs: bs, blocks: 64, policy: policy})
	prompt := testPrompt(6*bs, 3000)
	e.add(prompt, 1)
	w.drain(e)
	// Block 2 of the last shard fails to load: the request's KV is valid
	// up to block 2, in every rank.
	h := hashesOf(t, prompt, bs)
	w.rec.failGets(e.ns.Key(e.ns.Shards()-1, h[2]))
	e.dropCache()
	before := e.stats
	e.add(prompt, 1)
	w.drain(e)
	w.rec.failGets()
	w.expectHits(e, e.stats.externalHits-before.externalHits, 5, "the second request of a saved 6-block prompt", "all but the block with the last prompt token")
	if got := e.stats.failedLoads - before.failedLoads; got != 1 && e.storeFailure() == "" {
		t.Fatalf("%d loads failed, want 1: the store failed to read block 2 of shard %d", got, e.ns.Shards()-1)
	}
	w.finish()
}

// health checks the halves that are connector.HealthReporters across a
// store that goes down and comes back: healthy with no failure before;
// failing (ConsecutiveFailures and Failures counted, LastError and its
// time set) once a call of theirs failed; healthy again, Failures kept,
// once one succeeded.
func health(t *testing.T, open OpenFunc, opts Options) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	e := w.open(spec{label: "t0", open: open, tenant: "tenant0", order: connector.BlockMajor, tp: 2, repl: 1, bs: bs, blocks: 64})
	type half struct {
		name string
		hr   connector.HealthReporter
	}
	var halves []half
	if hr, ok := e.pair.Planner.(connector.HealthReporter); ok {
		halves = append(halves, half{"the scheduler half", hr})
	}
	for rank, wk := range e.pair.Workers {
		if hr, ok := wk.(connector.HealthReporter); ok {
			halves = append(halves, half{fmt.Sprintf("worker %d", rank), hr})
		}
	}
	if len(halves) == 0 {
		t.Skip("no half of the connector is a connector.HealthReporter")
	}
	e.add(testPrompt(6*bs, 15000), 1)
	w.drain(e)
	for _, h := range halves {
		if got := h.hr.Health(); got.Failures != 0 || !got.Healthy() || got.LastError != nil {
			t.Fatalf("%s's Health() = %+v after calls of a store that never failed, want no failure", h.name, got)
		}
	}
	// The store goes down: the lookup of a new prompt fails (a miss) and
	// so do its saves.
	w.rec.failCalls(true)
	e.add(testPrompt(6*bs, 16000), 1)
	w.drain(e)
	down := make([]connector.Health, len(halves))
	for i, h := range halves {
		got := h.hr.Health()
		down[i] = got
		if got.Failures == 0 || got.Healthy() || got.LastError == nil || got.LastErrorTime.IsZero() {
			t.Fatalf("%s's Health() = %+v after its lookups or saves failed (the store failed every call), want ConsecutiveFailures and Failures counted, LastError and LastErrorTime set", h.name, got)
		}
		if got.ConsecutiveFailures > got.Failures {
			t.Fatalf("%s's Health() = %+v: more consecutive failures than failures", h.name, got)
		}
	}
	// The store is back: a prompt's lookup and saves succeed.
	w.rec.failCalls(false)
	e.add(testPrompt(6*bs, 17000), 1)
	w.drain(e)
	for i, h := range halves {
		got := h.hr.Health()
		if !got.Healthy() || got.Failures < down[i].Failures || got.LastError == nil {
			t.Fatalf("%s's Health() = %+v after calls that succeeded, following failures (%+v), want healthy, with Failures kept (%d or more) and the last error", h.name, got, down[i], down[i].Failures)
		}
	}
	w.finish()
}

// lieName names a lie in a subtest's name.
func lieName(l lie) string {
	return [...]string{"", "OtherKey", "Flipped", "Truncated", "ForgedTrailer"}[l]
}

// wrongValue checks that a block whose get succeeds with wrong bytes ends
// as a failed block, never loaded: every get of block 2 of the last shard
// serves the bytes l says (the engine checks the bytes of every block
// reported loaded, and fails the test on one that differs).
func wrongValue(t *testing.T, open OpenFunc, opts Options, l lie, order connector.Order, tp int) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	w.rec.keepValues()
	const bs = 4
	e := w.open(spec{label: "t0", open: open, tenant: "tenant0", order: order, tp: tp, repl: 1, bs: bs, blocks: 64})
	prompt := testPrompt(6*bs, 13000)
	e.add(prompt, 1)
	w.drain(e)
	h := hashesOf(t, prompt, bs)
	shard := e.ns.Shards() - 1
	w.rec.lieGets(l, e.ns.Key(shard, h[2]))
	e.dropCache()
	before := e.stats
	e.add(prompt, 1)
	w.drain(e)
	w.rec.lieGets(lieNone)
	w.expectHits(e, e.stats.externalHits-before.externalHits, 5, "the second request of a saved 6-block prompt", "all but the block with the last prompt token")
	if e.storeFailure() != "" {
		w.finish()
		return
	}
	if w.rec.liesServed(l) == 0 {
		t.Fatalf("the store served block 2 of shard %d, which the request matched, to no successful get: a load reported done must have read it", shard)
	}
	if got := e.stats.failedLoads - before.failedLoads; got != 1 {
		t.Fatalf("%d loads failed, want 1: every get of block 2 of shard %d succeeded with %s, which must end as a failed block, never loaded", got, shard, l)
	}
	w.finish()
}

func shards(t *testing.T, open OpenFunc, opts Options) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	e := w.open(spec{label: "t0", open: open, tenant: "tenant0", order: connector.BlockMajor, tp: 2, repl: 1, bs: bs, blocks: 64})
	prompt := testPrompt(6*bs, 5000)
	h := hashesOf(t, prompt, bs)
	// Block 2 is saved for shard 0 only.
	w.rec.failPuts(e.ns.Key(1, h[2]))
	e.add(prompt, 1)
	w.drain(e)
	w.rec.failPuts()
	e.dropCache()
	before := e.stats.externalHits
	e.add(prompt, 1)
	w.drain(e)
	w.expectHits(e, e.stats.externalHits-before, 2, "a request for a 6-block prompt whose block 2 the store holds for shard 0 only", "the blocks before block 2")
	// The request saved block 2 of shard 1: all but the last block now.
	e.dropCache()
	before = e.stats.externalHits
	e.add(prompt, 1)
	w.drain(e)
	w.expectHits(e, e.stats.externalHits-before, 5, "a third request of the prompt", "all but the block with the last prompt token")
	w.finish()
}

func rotation(t *testing.T, open OpenFunc, opts Options) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	s := spec{label: "t0", open: open, tenant: "tenant0", order: connector.BlockMajor, tp: 2, repl: 1, bs: bs, blocks: 64}
	e := w.open(s)
	rot, ok := e.pair.Planner.(connector.Rotator)
	if !ok {
		t.Fatalf("the scheduler half does not implement connector.Rotator (set Options.NoRotation)")
	}
	prompt := testPrompt(6*bs, 7000)
	e.add(prompt, 1)
	w.drain(e)
	e.rotate(rot)
	before := e.stats.externalHits
	e.add(prompt, 1)
	w.drain(e)
	if got := e.stats.externalHits - before; got != 0 {
		t.Fatalf("after Rotate(1), a request matched %d blocks that only generation 0 saved", got)
	}
	for _, gen := range []uint64{1, 0} {
		if err := rot.Rotate(gen); !errors.Is(err, connector.ErrGeneration) {
			t.Fatalf("Rotate(%d) in generation 1 = %v, want an error wrapping connector.ErrGeneration: generations only move forward", gen, err)
		}
	}
	e.step(context.Background(), 0) // Plan checks the generation is still 1
	// A fresh engine of the new generation reads back what the rotated
	// engine saved.
	s.label, s.gen = "t0-fresh", 1
	fresh := w.open(s)
	fresh.add(prompt, 1)
	w.drain(fresh)
	w.expectHits(fresh, fresh.stats.externalHits, 5, "a fresh engine of generation 1, for a 6-block prompt the rotated engine computed in generation 1", "all but the block with the last prompt token: the workers save under the new generation's keys")
	w.finish()
}

func layouts(t *testing.T, open OpenFunc, opts Options) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	a := w.open(spec{label: "heads4", open: open, tenant: "tenant0", order: connector.BlockMajor, tp: 1, repl: 1, bs: bs, blocks: 64})
	b := w.open(spec{label: "heads2", open: open, tenant: "tenant0", heads: 2, order: connector.BlockMajor, tp: 1, repl: 1, bs: bs, blocks: 64})
	prompt := testPrompt(6*bs, 9000)
	a.add(prompt, 1)
	w.drain(a)
	b.add(prompt, 1)
	w.drain(b)
	if b.stats.externalHits != 0 {
		t.Fatalf("an engine with Layout.KVHeads 2 matched %d blocks that only an engine with KVHeads 4 saved: layouts never share blocks", b.stats.externalHits)
	}
	w.finish()
}

// stateMachine is one rapid test case of two engines over one store.
func stateMachine(t *rapid.T, open OpenFunc, opts Options, c *counts) {
	c.cases++
	w := newWorld(t, opts, c)
	defer w.close()
	if !opts.NoFaults && rapid.Bool().Draw(t, "faults") {
		w.addFaults(storetest.FaultOptions{
			Seed:       rapid.Uint64().Draw(t, "faultSeed"),
			CallRate:   0.02,
			KeyRate:    0.1,
			VanishRate: 0.1,
			Scribble:   true,
		})
	}
	s := spec{
		label:   "t0",
		open:    open,
		tenant:  "tenant0",
		policy:  rapid.SampledFrom([]connector.Policy{connector.PolicyRecompute, connector.PolicyFail}).Draw(t, "policy"),
		order:   rapid.SampledFrom([]connector.Order{connector.BlockMajor, connector.LayerMajor}).Draw(t, "order"),
		bs:      rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "blockSize"),
		blocks:  rapid.IntRange(40, 96).Draw(t, "blocks"), // the longest request needs 36
		waiter:  rapid.Bool().Draw(t, "waiter"),
		layered: rapid.Bool().Draw(t, "layered"),
	}
	shape := rapid.SampledFrom([][2]int{{1, 1}, {2, 1}, {2, 2}}).Draw(t, "tp")
	s.tp, s.repl = shape[0], shape[1]
	if opts.Groups && rapid.Bool().Draw(t, "hybrid") {
		c.hybrid++
		s.hybrid = true
		s.window = rapid.IntRange(1, 3*s.bs+1).Draw(t, "window")
		s.stateEvery = rapid.IntRange(0, 3).Draw(t, "stateEvery")
	}
	specs := []spec{s}
	s.label = "t1"
	switch rapid.SampledFrom([]string{"another tenant", "another layout", "the same identity"}).Draw(t, "second engine") {
	case "another tenant":
		s.tenant = "tenant1"
	case "another layout":
		s.heads = 2
	}
	specs = append(specs, s)
	engines := []*engine{w.open(specs[0]), w.open(specs[1])}
	// Prompts share a few documents as prefixes, as system prompts and
	// multi-turn histories do.
	docs := make([][]hashing.Token, 2)
	for i := range docs {
		docs[i] = rapid.SliceOfN(rapid.Uint32Range(0, 50000), 4, 24).Draw(t, fmt.Sprintf("doc%d", i))
	}
	pick := func(t *rapid.T) *engine { return engines[rapid.IntRange(0, 1).Draw(t, "engine")] }
	t.Repeat(map[string]func(*rapid.T){
		"add": func(t *rapid.T) {
			e := pick(t)
			if len(e.reqs) >= 6 {
				t.Skip("enough requests")
			}
			e.add(prompt(t, docs), rapid.IntRange(0, 4).Draw(t, "decode"))
		},
		"again": func(t *rapid.T) {
			// A prompt the engine (or the other one) ran before, with the
			// local cache gone or not: the store serves it, or its load
			// fails.
			e, o := pick(t), pick(t)
			if len(o.history) == 0 || len(e.reqs) >= 6 {
				t.Skip("no prompt ran yet")
			}
			switch rapid.IntRange(0, 2).Draw(t, "local") {
			case 0:
				e.dropCache()
			case 1:
				e.evictOne()
			}
			e.add(o.history[rapid.IntRange(0, len(o.history)-1).Draw(t, "prompt")], rapid.IntRange(0, 4).Draw(t, "decode"))
			if rapid.Bool().Draw(t, "drain") {
				w.drain(e)
			}
		},
		"step": func(t *rapid.T) {
			e := pick(t)
			chunk := rapid.SampledFrom([]int{0, 1, 3, 8}).Draw(t, "chunk")
			for range rapid.IntRange(1, 4).Draw(t, "steps") {
				e.step(context.Background(), chunk)
			}
		},
		"drain": func(t *rapid.T) {
			// Every request runs to its end and every save lands, so that
			// later requests find their prefixes in the store.
			w.drain(pick(t))
		},
		"dropLocal": func(t *rapid.T) {
			// The local cache is lost (eviction, a restart): only the
			// store can serve prefixes now.
			pick(t).dropCache()
		},
		"preempt": func(t *rapid.T) {
			e := pick(t)
			if len(e.reqs) == 0 {
				t.Skip("no request")
			}
			e.preempt(e.reqs[rapid.IntRange(0, len(e.reqs)-1).Draw(t, "req")])
		},
		"evictLocal": func(t *rapid.T) {
			if !pick(t).evictOne() {
				t.Skip("nothing cached")
			}
		},
		"rotate": func(t *rapid.T) {
			if opts.NoRotation {
				t.Skip("no rotation")
			}
			e := pick(t)
			rot, ok := e.pair.Planner.(connector.Rotator)
			if !ok {
				t.Fatalf("the scheduler half does not implement connector.Rotator (set Options.NoRotation)")
			}
			// Rotations are rare: each one empties what the store can
			// serve.
			if rapid.IntRange(0, 3).Draw(t, "rotateNow") > 0 {
				e.step(context.Background(), 0)
				return
			}
			e.rotate(rot)
		},
	})
	w.drain(engines...)
	// A fresh engine of each identity, in its current generation, reads
	// back what the prompts its engine ran left in the store.
	for i, e := range engines {
		if len(e.history) == 0 {
			continue
		}
		fs := specs[i]
		fs.label, fs.gen = fs.label+"-fresh", e.id.Generation
		fresh := w.open(fs)
		for _, p := range e.history {
			fresh.add(p, 0)
		}
		w.drain(fresh)
	}
	w.finish()
}

// prompt draws a prompt: a prefix of one of docs and a few tokens of its
// own.
func prompt(t *rapid.T, docs [][]hashing.Token) []hashing.Token {
	doc := docs[rapid.IntRange(0, len(docs)-1).Draw(t, "doc")]
	cut := rapid.IntRange(len(doc)/2, len(doc)).Draw(t, "cut")
	suffix := rapid.SliceOfN(rapid.Uint32Range(0, 50000), 0, 8).Draw(t, "suffix")
	return append(slices.Clone(doc[:cut]), suffix...)
}

// openPD opens the producer and consumer engines of one test case.
func openPD(w *world, open OpenFunc, s spec) (prod, cons *engine) {
	w.t.Helper()
	s.label, s.open = "p", open
	prod = w.open(s)
	s.label, s.open = "c", w.opts.OpenConsumer
	cons = w.open(s)
	if _, ok := prod.pair.Planner.(connector.TransferParamsSource); !ok {
		w.t.Fatalf("the producer's scheduler half does not implement connector.TransferParamsSource")
	}
	return prod, cons
}

func handoff(t *testing.T, open OpenFunc, opts Options, order connector.Order, tp, repl int) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	prod, cons := openPD(w, open, spec{tenant: "tenant0", order: order, tp: tp, repl: repl, bs: bs, blocks: 64})
	prod.add(testPrompt(6*bs, 2000), 0)
	w.drainPD(prod, cons, 2)
	w.expectHits(cons, cons.stats.externalHits, 5, "the consumer of a 6-block prompt the producer prefilled", "all but the block with the last prompt token")
	if cons.stats.loads == 0 {
		t.Errorf("no load finished on the consumer")
	}
	w.finish()
}

// handoffRealSize is Handoff with KV blocks of real size.
func handoffRealSize(t *testing.T, open OpenFunc, opts Options, c realSizeCase) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 16
	prod, cons := openPD(w, open, spec{tenant: "tenant0", order: c.order, tp: c.tp, repl: 1, bs: bs, blocks: 14, layers: c.layers, blockBytes: c.blockBytes})
	prod.add(testPrompt(6*bs, 24000), 0)
	w.drainPD(prod, cons, 2)
	w.expectHits(cons, cons.stats.externalHits, 5, fmt.Sprintf("the consumer of a 6-block prompt the producer prefilled, in blocks of %d bytes per rank", c.layers*2*c.blockBytes), "all but the block with the last prompt token")
	if cons.stats.loads == 0 || cons.stats.failedLoads > 0 {
		t.Fatalf("%d loads of the consumer finished and %d failed, in blocks of %d bytes per rank, want 1 and none", cons.stats.loads, cons.stats.failedLoads, c.layers*2*c.blockBytes)
	}
	w.finish()
}

// paramLie is a way in which the harness tampers with the transfer
// parameters it hands from the producer to the consumer, as a client that
// sends them back in a request's body can.
type paramLie uint8

const (
	paramOtherRequest  paramLie = iota // another request's parameters, of a prompt of the same length
	paramFlipped                       // a byte flipped, at each of many positions
	paramTruncated                     // cut short
	paramOtherProducer                 // of the same prompt, from a producer of another identity
)

var paramLies = []paramLie{paramOtherRequest, paramFlipped, paramTruncated, paramOtherProducer}

func (l paramLie) String() string {
	return [...]string{"OtherRequest", "Flipped", "Truncated", "OtherProducer"}[l]
}

// offersOf steps the producers es until each has n offers.
func (w *world) offersOf(n int, es ...*engine) {
	w.t.Helper()
	start := time.Now()
	var p pause
	for slices.ContainsFunc(es, func(e *engine) bool { return len(e.offers) < n }) {
		if time.Since(start) > waitBound {
			w.gaveUp("the producers made no %d offers in %v: %s", n, waitBound, describe(es))
		}
		changed := false
		for _, e := range es {
			if e.step(context.Background(), 0) {
				changed = true
			}
		}
		if !changed {
			p.sleep()
		}
	}
}

// tamper returns the parameters l makes of pa, a request's parameters,
// pb, another request's of a prompt of the same length, and other, those
// of pa's prompt from a producer of another identity; and what each is,
// for messages.
func tamper(l paramLie, pa, pb, other []byte) (tampered [][]byte, what []string) {
	switch l {
	case paramOtherRequest:
		return [][]byte{pb}, []string{"the parameters of another request, of a prompt of the same length"}
	case paramFlipped:
		step := max(1, len(pa)/48)
		for i := 0; i < len(pa); i += step {
			c := bytes.Clone(pa)
			c[i] ^= 0x01
			tampered = append(tampered, c)
			what = append(what, fmt.Sprintf("the request's parameters with byte %d of %d flipped (%q to %q)", i, len(pa), pa[i], c[i]))
		}
	case paramTruncated:
		for _, n := range []int{1, len(pa) / 2, len(pa) - 1} {
			tampered = append(tampered, bytes.Clone(pa[:n]))
			what = append(what, fmt.Sprintf("the request's parameters cut to %d of %d bytes", n, len(pa)))
		}
	case paramOtherProducer:
		return [][]byte{other}, []string{"the parameters of the same prompt from a producer of another identity (tenant)"}
	}
	return tampered, what
}

// paramsOf returns the transfer parameters that the producer p offered
// for its finished request of prompt, failing the test if it gave none.
func paramsOf(t *testing.T, p *engine, prompt []hashing.Token) []byte {
	t.Helper()
	for _, o := range p.offers {
		if slices.Equal(o.prompt, prompt) {
			return o.params
		}
	}
	t.Fatalf("the producer's TransferParams gave no parameters for a finished request of a %d-token prompt", len(prompt))
	return nil
}

// wrongParams checks that transfer parameters the harness tampered with
// (l) load nothing: every consumer request handed them ends with its
// loads failed, or with no match, never with a block reported loaded (the
// engine checks the bytes of every block reported loaded, too). Then the
// genuine parameters still load, byte for byte.
func wrongParams(t *testing.T, open OpenFunc, opts Options, l paramLie) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	s := spec{tenant: "tenant0", order: connector.BlockMajor, tp: 2, repl: 1, bs: bs, blocks: 128}
	prod, cons := openPD(w, open, s)
	a, b := testPrompt(6*bs, 31000), testPrompt(6*bs, 32000)
	prod.add(a, 0)
	prod.add(b, 0)
	w.offersOf(2, prod)
	pa, pb := paramsOf(t, prod, a), paramsOf(t, prod, b)
	var otherParams []byte
	if l == paramOtherProducer {
		o := s
		o.label, o.open, o.tenant = "p-other", open, "tenant1"
		other := w.open(o)
		other.add(a, 0)
		w.offersOf(1, other)
		otherParams = other.offers[0].params
		other.offers = nil
	}
	tampered, what := tamper(l, pa, pb, otherParams)
	for i, p := range tampered {
		before := cons.stats
		cons.addWith(a, 0, p)
		w.drain(cons)
		if n := cons.stats.loads - before.loads; n > 0 {
			t.Fatalf("the consumer loaded a request handed %s: %d loads reported done; parameters a client may have forged load nothing but the blocks their producer offered for them, never another request's, and a load of tampered ones fails", what[i], n)
		}
	}
	// The genuine parameters still load (the consumer computed the prompt
	// itself meanwhile: its local cache goes first).
	cons.dropCache()
	before := cons.stats.externalHits
	w.drainPD(prod, cons, 0)
	w.expectHits(cons, cons.stats.externalHits-before, 10, "the consumer's requests of the two prompts handed their genuine parameters after the tampered ones", "all but the block with the last prompt token, of each")
	w.finish()
}

// disaggregatedMachine is one rapid test case of a producer and a consumer.
func disaggregatedMachine(t *rapid.T, open OpenFunc, opts Options, c *counts) {
	c.cases++
	w := newWorld(t, opts, c)
	defer w.close()
	s := spec{
		tenant: "tenant0",
		policy: rapid.SampledFrom([]connector.Policy{connector.PolicyRecompute, connector.PolicyFail}).Draw(t, "policy"),
		order:  rapid.SampledFrom([]connector.Order{connector.BlockMajor, connector.LayerMajor}).Draw(t, "order"),
		bs:     rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "blockSize"),
		blocks: rapid.IntRange(40, 96).Draw(t, "blocks"),
		waiter: rapid.Bool().Draw(t, "waiter"),
	}
	shape := rapid.SampledFrom([][2]int{{1, 1}, {2, 1}, {2, 2}}).Draw(t, "tp")
	s.tp, s.repl = shape[0], shape[1]
	prod, cons := openPD(w, open, s)
	docs := make([][]hashing.Token, 2)
	for i := range docs {
		docs[i] = rapid.SliceOfN(rapid.Uint32Range(0, 50000), 4, 24).Draw(t, fmt.Sprintf("doc%d", i))
	}
	t.Repeat(map[string]func(*rapid.T){
		"prefill": func(t *rapid.T) {
			if len(prod.reqs) >= 6 {
				t.Skip("enough requests")
			}
			prod.add(prompt(t, docs), 0)
		},
		"handoff": func(t *rapid.T) {
			if len(prod.offers) == 0 || len(cons.reqs) >= 6 {
				t.Skip("nothing to hand on")
			}
			i := rapid.IntRange(0, len(prod.offers)-1).Draw(t, "offer")
			o := prod.offers[i]
			prod.offers = slices.Delete(prod.offers, i, i+1)
			cons.addWith(o.prompt, rapid.IntRange(0, 4).Draw(t, "decode"), o.params)
		},
		"addLocal": func(t *rapid.T) {
			if len(cons.reqs) >= 6 {
				t.Skip("enough requests")
			}
			cons.add(prompt(t, docs), rapid.IntRange(0, 4).Draw(t, "decode"))
		},
		"step": func(t *rapid.T) {
			chunk := rapid.SampledFrom([]int{0, 1, 3, 8}).Draw(t, "chunk")
			for range rapid.IntRange(1, 4).Draw(t, "steps") {
				prod.step(context.Background(), chunk)
				cons.step(context.Background(), chunk)
			}
		},
		"preempt": func(t *rapid.T) {
			if len(cons.reqs) == 0 {
				t.Skip("no request")
			}
			cons.preempt(cons.reqs[rapid.IntRange(0, len(cons.reqs)-1).Draw(t, "req")])
		},
		"dropLocal": func(t *rapid.T) { cons.dropCache() },
	})
	w.drainPD(prod, cons, 1)
	w.finish()
}

// refusesGroups checks that a connector that does not declare
// Options.Groups refuses a hybrid layout at open.
func refusesGroups(t *testing.T, open OpenFunc, opts Options) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	s := spec{tenant: "tenant0", order: connector.BlockMajor, tp: 1, repl: 1, bs: 4, blocks: 64, hybrid: true}
	opens := []struct {
		what string
		open OpenFunc
	}{{"the pair", open}}
	if opts.OpenConsumer != nil {
		opens = []struct {
			what string
			open OpenFunc
		}{{"the producer's pair", open}, {"the consumer's pair", opts.OpenConsumer}}
	}
	for _, o := range opens {
		pair, err := o.open(connector.Config{LoadFailurePolicy: connector.PolicyRecompute}, connector.Env{Identity: s.identity(), Store: w.st, Blocks: s.blocks})
		closeHalves(pair)
		if err == nil {
			t.Fatalf("open of %s succeeded for a layout of 3 KV cache groups (full, sliding_window, state), but Options.Groups is not set: a connector that supports KV cache groups sets it, one that does not refuses them with an error wrapping connector.ErrConfig", o.what)
		}
		if !errors.Is(err, connector.ErrConfig) {
			t.Fatalf("open of %s for a layout of 3 KV cache groups = %v, want an error wrapping connector.ErrConfig (or set Options.Groups)", o.what, err)
		}
	}
	w.finish()
}

// groups runs the subtests of a hybrid layout: one full-attention, one
// sliding-window (of 2×4+1 tokens, two blocks before a boundary) and one
// state group, in blocks of 4 tokens.
func groups(t *testing.T, open OpenFunc, opts Options) {
	t.Run("SharedPrefix", func(t *testing.T) {
		for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
			for _, tp := range [][2]int{{1, 1}, {2, 1}, {2, 2}} {
				t.Run(fmt.Sprintf("%v/tp%d-repl%d", order, tp[0], tp[1]), func(t *testing.T) {
					groupsSharedPrefix(t, open, opts, order, tp[0], tp[1])
				})
			}
		}
	})
	t.Run("LocalHit", func(t *testing.T) { groupsLocalHit(t, open, opts) })
	t.Run("Window", func(t *testing.T) { groupsWindow(t, open, opts) })
	t.Run("States", func(t *testing.T) { groupsStates(t, open, opts) })
	if !opts.NoFaults {
		t.Run("LoadFailure", func(t *testing.T) {
			for _, policy := range []connector.Policy{connector.PolicyRecompute, connector.PolicyFail} {
				t.Run(string(policy), func(t *testing.T) { groupsLoadFailure(t, open, opts, policy) })
			}
		})
	}
}

// hybridSpec returns the spec of the Groups subtests' engines.
func hybridSpec(open OpenFunc, order connector.Order, tp, repl, stateEvery int) spec {
	return spec{label: "t0", open: open, tenant: "tenant0", order: order, tp: tp, repl: repl, bs: 4, blocks: 64, hybrid: true, stateEvery: stateEvery}
}

func groupsSharedPrefix(t *testing.T, open OpenFunc, opts Options, order connector.Order, tp, repl int) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	e := w.open(hybridSpec(open, order, tp, repl, 1))
	prompt := testPrompt(6*4, 1100)
	e.add(prompt, 2)
	w.drain(e)
	// Two more requests, each with the local cache gone: the first holds
	// blocks in the sliding-window entries before the window (poisoned,
	// freed after the load), the second NoBlock there, as vLLM does.
	for _, which := range []string{"second", "third"} {
		e.dropCache()
		before := e.stats.externalHits
		e.add(prompt, 2)
		w.drain(e)
		w.expectHits(e, e.stats.externalHits-before, 5, fmt.Sprintf("the %s request of a saved 6-block prompt", which),
			"all but the block with the last prompt token: every group can resume at block 5, with the window before it and the state after block 4")
	}
	if e.stats.loads == 0 && e.storeFailure() == "" {
		t.Errorf("no load finished")
	}
	w.finish()
}

func groupsLocalHit(t *testing.T, open OpenFunc, opts Options) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	e := w.open(hybridSpec(open, connector.LayerMajor, 2, 1, 1))
	prompt := testPrompt(8*bs+1, 1300)
	h := hashesOf(t, prompt, bs)
	e.add(prompt, 0)
	w.drain(e)
	for _, which := range []string{"second", "third"} {
		// Without full-attention block 3 in the local cache, the local
		// hit is 3 blocks (the window before block 3 and the state after
		// block 2 are cached): the store serves blocks 3 to 7 of full
		// attention, 6 and 7 of the window, the state after block 7.
		e.evict(0, h[3])
		before := e.stats
		e.add(prompt, 0)
		w.drain(e)
		if got := e.stats.localHits - before.localHits; got != 3 {
			t.Fatalf("the %s request had a local hit of %d blocks, want 3 (the harness's own local cache)", which, got)
		}
		w.expectHits(e, e.stats.externalHits-before.externalHits, 5, fmt.Sprintf("the %s request of a saved 8-block prompt (and a token), with a local hit of 3 blocks", which),
			"blocks 3 to 7: every group can resume at block 8")
	}
	w.finish()
}

func groupsWindow(t *testing.T, open OpenFunc, opts Options) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	e := w.open(hybridSpec(open, connector.BlockMajor, 2, 1, 1))
	prompt := testPrompt(8*bs+1, 1500)
	h := hashesOf(t, prompt, bs)
	// Block 6 of the sliding window is saved for shard 0 only.
	w.rec.failPuts(e.ns.GroupKey(1, 1, h[6]))
	e.add(prompt, 0)
	w.drain(e)
	w.rec.failPuts()
	e.dropCache()
	before := e.stats.externalHits
	e.add(prompt, 0)
	w.drain(e)
	w.expectHits(e, e.stats.externalHits-before, 6, "a request for an 8-block prompt (and a token) whose sliding-window block 6 the store holds for shard 0 only",
		"the blocks before block 6: the windows of the tokens at 28 and 32 (tokens 20 to 28, 24 to 32) need block 6, the window of the token at 24 does not")
	// The request saved block 6 of the window: all but the last block now.
	e.dropCache()
	before = e.stats.externalHits
	e.add(prompt, 0)
	w.drain(e)
	w.expectHits(e, e.stats.externalHits-before, 8, "a third request of the prompt", "all but the block with the last prompt token")
	// A block the store lacks before the window of the match's end
	// shortens nothing.
	other := testPrompt(8*bs+1, 1600)
	w.rec.failPuts(e.ns.GroupKey(1, 0, hashesOf(t, other, bs)[1]))
	e.add(other, 0)
	w.drain(e)
	w.rec.failPuts()
	e.dropCache()
	before = e.stats.externalHits
	e.add(other, 0)
	w.drain(e)
	w.expectHits(e, e.stats.externalHits-before, 8, "a request for an 8-block prompt (and a token) whose sliding-window block 1 the store holds for shard 1 only",
		"all but the block with the last prompt token: the window of the token at 32 (tokens 24 to 32) does not reach block 1")
	w.finish()
}

func groupsStates(t *testing.T, open OpenFunc, opts Options) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	e := w.open(hybridSpec(open, connector.BlockMajor, 1, 1, 0))
	prompt := testPrompt(8*bs+1, 1700)
	// Prefilled in chunks of 3 blocks, the engine keeps the states after
	// blocks 2 and 5, at the ends of its chunks, and no other.
	e.add(prompt, 0)
	w.drainChunked(e, 3*bs)
	e.dropCache()
	before := e.stats.externalHits
	e.add(prompt, 0)
	w.drain(e)
	w.expectHits(e, e.stats.externalHits-before, 6, "a request for an 8-block prompt (and a token) whose states the store holds after blocks 2 and 5 only",
		"6 blocks: the last boundary with a saved state")
	w.finish()
}

func groupsLoadFailure(t *testing.T, open OpenFunc, opts Options, policy connector.Policy) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	s := hybridSpec(open, connector.LayerMajor, 2, 1, 1)
	s.policy = policy
	e := w.open(s)
	prompt := testPrompt(6*bs, 1900)
	h := hashesOf(t, prompt, bs)
	e.add(prompt, 1)
	w.drain(e)
	// The state after block 4, where the match ends, fails to load in the
	// last shard: nothing of the load is of use, and the request is valid
	// up to its local hit, 0 tokens.
	last := e.ns.GroupShards(2) - 1
	w.rec.failGets(e.ns.GroupKey(2, last, h[4]))
	e.dropCache()
	before := e.stats
	e.add(prompt, 1)
	w.drain(e)
	w.rec.failGets()
	w.expectHits(e, e.stats.externalHits-before.externalHits, 5, "the second request of a saved 6-block prompt", "all but the block with the last prompt token")
	if got := e.stats.failedLoads - before.failedLoads; got != 1 && e.storeFailure() == "" {
		t.Fatalf("%d loads failed, want 1: the store failed to read the state after block 4 for shard %d", got, last)
	}
	w.finish()
}
