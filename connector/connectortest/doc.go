// Package connectortest checks that a connector keeps the promises of
// package connector. Any connector, ours or a third party's, runs it from a
// test, as testing/fstest.TestFS is run for a file system.
//
// # Usage
//
// Give Run an [OpenFunc] that opens the two halves of the connector with
// the Config and Env it is handed, and a store factory:
//
//	func TestConnector(t *testing.T) {
//		open := func(cfg connector.Config, env connector.Env) (connectortest.Pair, error) {
//			cfg.Connector = mine.Name // the harness set the load failure policy
//			s, err := connector.OpenPlanner(cfg, env)
//			... one connector.OpenWorker per rank, env.Rank set ...
//			return connectortest.Pair{Planner: s, Workers: workers}, nil
//		}
//		connectortest.Run(t, open, connectortest.Options{NewStore: newStore})
//	}
//
// ExampleRun shows the whole function for the store connector over the
// embedded store. A connector for disaggregated prefill and decode (one
// that hands a request's KV from a producer instance to a consumer
// instance, such as connector/p2p) also sets Options.OpenConsumer; Run
// then drives two model engines, prefilling on the producer and handing
// each request on with the transfer parameters of the producer's
// connector.TransferParamsSource. With Options.ConsumerProcess as well,
// Run hands each request on to a consumer engine in a child process of
// the test binary instead, through a pipe that carries only the prompts
// and their transfer parameters: a consumer that finds the producer's
// offers or memory through its own process fails there. A connector whose
// transfer engine registers only memory of its own (rdma/shm) allocates
// the KV memory the harness registers through Pair.Alloc. -rapid.checks
// sets how many state machine cases run (100 by default); go test -v logs
// how many loads, failed loads, saves, rotations and faults they made.
//
// # The model engine
//
// Run drives the connector from a model of an inference engine with paged
// KV memory: a local prefix cache, requests sharing prefixes, chunked
// prefill, decode, preemption (of the youngest admitted request, so that
// the oldest always progresses), rotations, and KV bytes that are a known
// function of the namespace (tenant, model, generation, layout...), the
// shard and the block hash. So the harness checks byte for byte every
// block a connector loads, and tells what a wrong block holds instead:
// poison (never written), another generation's KV, another shard's,
// another identity's, or the engine's unfinished write.
//
// Blocks that nothing may write (free, not yet computed, or whose load was
// reported failed) hold poison, checked whenever the engine touches them
// again. The engine writes each step's KV in two halves: the first half
// and garbage, then, once every worker with a save of such a block waits
// on its ready event (or has finished that save), the rest, and only then
// fires the events; a save that reads its blocks early stores garbage, and
// the next load of them finds it.
//
// A connector that supports KV cache groups sets Options.Groups; Run then
// also drives engines of a hybrid layout: one full-attention, one
// sliding-window and one state group, at the layout's block size. Such an
// engine keeps a block table per group, as vLLM's hybrid allocator does:
// every block of full attention; the window of the sliding-window group,
// freeing (NoBlock) the blocks that fall out of it as it schedules the
// request, once no unfinished transfer names them; states only at the
// ends of its steps and at some boundaries, NoBlock elsewhere. At
// admission some requests hold NoBlock in the sliding-window entries
// between the local hit and the window, others a poisoned block. The
// bytes of a block name its group, and its position: a state loaded into
// the wrong entry is told as a state of another position. After every
// load the harness checks that the Metadata named exactly the entries
// resuming at the match's end needs beyond the local hit, that each holds
// what was saved, and that no other block of the request changed. A
// connector without Options.Groups must refuse the hybrid layout at open
// with connector.ErrConfig.
//
// # Layer by layer
//
// Where every worker is a connector.LayerWorker, half of the state
// machine's cases (and the LayerWise subtest) drive the workers layer by
// layer, as an engine overlapping compute and transfers does: after Start,
// for each layer in order, every worker's WaitLayer, then every worker's
// SaveLayer with an event that fires once the layer is computed, as a
// device engine queues the layer's compute and records an event after
// it; then Save. The blocks a step computes hold unfinished bytes in
// every layer until its turn, and the harness notes a put handed a layer
// not yet computed: a SaveLayer that saves ahead of the compute, or
// before its event fires, is caught there, or by the garbage it stored. What each layer of each loaded block held when its WaitLayer
// returned is kept, and must be the saved bytes once the worker reports
// the block loaded; the Poll after WaitLayer of the last layer must
// report every load of the step. The LayerWise subtest also holds every
// get of the store while a step's WaitLayer(0) runs, and lets them go a
// while (100 ms) after the first arrives: a WaitLayer that returns before
// reports a layer in that cannot have arrived. A correct worker passes
// however slow the machine; a worker that is not a LayerWorker skips it.
//
// The harness wraps the store it gets from Options.NewStore, below any
// fault injection, and records what the store really holds: matches and
// KV events are checked against it, and Stats.Saves. A match must also be
// the longest one the store could serve with what puts had stored before
// the request's first Match, unless a store fault, a failed load, a failed
// lookup or an eviction excuses a shorter one. It also notes a put
// whose source is a block the step is still computing.
//
// # What a connector must do
//
// Beyond the contract of package connector, Run relies on what connectors
// sharing a store must do anyway: block h of shard s is stored under
// hashing.Namespace.Key(s, h) (of group g, under GroupKey(g, s, h)), once
// per shard (one replica saves it), or as values of ranges of its layers
// under LayerKey (a block so stored counts as stored once every layer is,
// and as saved at most as often as every layer was); a
// worker learns that a step is ready by looking at the event (Query, or
// Wait when the event is a connector.Waiter) from its own goroutines or
// from Poll; and a half that reports Stats counts in the fields the
// harness checks what connector.Stats says: the scheduler half HitBlocks,
// HitTokens and LoadFailures, each worker Loads, LoadFailures (blocks of
// loads dropped as stale count in StaleDiscarded, not here) and Corrupt
// (at most the blocks it reported failed with ReasonCorrupt: a load that
// fails from a corrupt block on, or transfer parameters refused before a
// byte was read, report more blocks with that reason than failed
// verification; and at least one, or a count in Refused, where any block
// failed so), and the worker halves together Saves.
//
// # Wrong bytes and a failing store
//
// The WrongValue subtest serves, on every successful get of one loaded
// block, wrong bytes of four kinds: another key's value of the same size,
// the value with a byte flipped, the value truncated by a quarter (N says
// so, the rest of the destination is as it was), and another key's value
// under this value's own last bytes (a forged trailer). Each must end as a
// failed block, never loaded: the engine checks the bytes of every block
// reported loaded, and the subtest requires the load to fail. A connector
// that loads raw bytes with no check of their key and content cannot pass
// it. The Health subtest takes the store down (every call fails) and
// back up: halves that are connector.HealthReporters report no failure
// before, counted failures and the last error while it is down, and
// healthy again, failures kept, once a call succeeded; and a failed
// lookup is a miss, never Pending for as long as the store is down.
//
// A disaggregated connector's loads bypass the store, so the WrongParams
// subtest tampers on the path the harness owns: the transfer parameters
// it hands from producer to consumer, as a client that sends them back in
// a request's body can. A consumer request of a prompt is handed another
// request's parameters (a prompt of the same length), the parameters with
// one byte flipped (at each of about 48 positions), cut short (to 1 byte,
// half, all but the last byte), or the parameters of the same prompt from
// a producer of another identity. None may lead to a load reported done
// (a refused request, no match, or failed blocks are all fine), and the
// engine checks the bytes of any block reported loaded; the genuine
// parameters then still load. With Options.ConsumerProcess, the
// CrossProcess subtests do the same across processes: one consumer
// process is handed every kind of tampered parameters and must load
// nothing, another the genuine ones.
//
// # Lifecycles, at real sizes
//
// The LayerCancel subtest loads a prompt of 136 blocks in 2 ranks (270
// keys in one step) layer by layer with the store holding every get, and
// ends the context of WaitLayer(0) while the layer's loads run: canceled
// once a get reached the store, or past a deadline. Each WaitLayer must
// return an error wrapping the context's: one that returns nil reports a
// layer in that cannot have arrived; one that has not returned while
// every goroutine of the process is blocked (so none can still make it
// return), for ten looks in a row a second or more after the context
// ended, ignores its context (a WaitLayer that polls its context with
// sleeps of a second or more counts as one). Then the gets go, the step
// waits on layer 0 again, as the contract allows, and the loads must end,
// each reported once, every block byte for byte, with no goroutine left
// after Close. (A held get that the connector's own timeout ends first
// fails its load, and a WaitLayer may then report the layer in.)
//
// The CloseInFlight subtest closes both halves while loads of 256 KiB
// blocks are held in the store and saves of others run. Close must return
// (the held gets go once it did, or a while after it began, for a Close
// that waits for what runs); the harness then copies every rank's KV
// memory, waits until no get is in the store and no goroutine of the
// connector runs, and requires the memory unchanged: nothing writes KV
// memory once Close returned. The memory is freed after each half's next
// Close, so a transfer still reading it crashes the test.
//
// A disaggregated connector's loads bypass the store, so with
// Options.Gate its CloseInFlight subtest holds them in the transfer
// engines instead: the consumer's halves close while every transfer of
// a load of 8 blocks of 256 KiB per rank from the producer waits in the
// gate, with the same checks.
//
// The RealSize subtests (and, for a disaggregated connector, RealSize of
// Handoff) move blocks of 256 KiB to 1 MiB per rank, in 4 to 8 layers of
// blocks of 16 tokens, block-major and layer-major, one of them layer by
// layer, checked byte for byte, with no load failed: whatever holds only
// for small values (a fixed-size buffer, a copy that wraps) fails there.
// The engine's KV bytes are a SplitMix64 stream seeded by the namespace,
// the group, the shard and the block hash, so no pattern repeats within
// a block, nor between blocks.
//
// Once Finish said a request is not kept, or once Update released it, the
// engine frees its blocks, and may reuse them at once. The store's
// recorder knows which engine block every address of the engines' KV
// memory belongs to, and fails a put whose source is a block no request
// owns (free, or in the engine's local prefix cache): a save that still
// reads a request's blocks after the connector let them go.
//
// # Promises and the checks that prove them
//
// Of connector.Planner: Match never covers the last prompt token, is a
// whole number of blocks, 0 while Pending, and the longest prefix the
// store held in every shard before the request's first Match (the
// recorder's record; SharedPrefix, Shards, StateMachine); Allocated and
// Scheduled lead to Plans that load only what resuming needs and save
// only blocks the engine computed or loaded, with unique transfer ids,
// increasing steps and the current generation (every step); Update's
// Progress lists loads only once every worker reported them, failures
// with the right Valid and Fail for the policy (LoadFailure,
// StateMachine), releases only of kept requests; Finish keeps a request
// while a transfer touches its blocks (StateMachine), and once it did not
// keep it (or released it) nothing reads its blocks (every put, against
// the engine's blocks no request owns); Close is idempotent and joins
// every goroutine (every case's end), and with transfers in flight
// returns, after which nothing writes KV memory (CloseInFlight). Of
// connector.Worker: Start loads into the registered blocks byte for byte,
// at any block size (every step; RealSize), Save reads blocks only once
// ready fires (the engine's two-half writes), Poll reports each transfer
// once, with failures inside it (every step); wrong bytes from the store
// are never loaded (WrongValue). Of the optional interfaces:
// LayerWorker's WaitLayer returns only once the layer is in, returns the
// context's error once its context ends first, and may be waited on again
// (LayerWise, LayerCancel, StateMachine), and SaveLayer saves only
// computed layers (LayerWise, StateMachine); Rotator (Rotation);
// EventSource's BlockStored events name only stored blocks, consecutive
// after Parent, with their tokens (every step); StatsReporter's Loads,
// LoadFailures, Corrupt, HitBlocks, HitTokens and Saves (every case);
// HealthReporter (Health); Waker (Waiting, below); TransferParamsSource
// (Handoff, and WrongParams: parameters a client tampered with load
// nothing, for OpenConsumer); groups, or connector.ErrConfig without them
// (Groups, NoGroups). The Metadata Plan returns holds the same until the
// step ends, Update included: it is read-only to the workers and valid
// until the next Plan (every step).
//
// Not checked: for a disaggregated connector, LayerCancel (no
// disaggregated connector here is a LayerWorker to check it against), and
// CloseInFlight where Options.Gate is not set; and a save that stages its copy reads the
// engine's blocks where the recorder does not see it, so a staged save of
// a freed block is caught only by the bytes it stored, once they are
// loaded.
//
// # Waiting
//
// Nothing depends on the speed of the machine. Where the harness waits for
// a connector's background work (a lookup that answers Pending, a
// transfer not yet reported, a save not yet looking at its event, a
// goroutine on its way out) it waits for the condition itself, and fails
// after a minute naming what it waited for. Where progress is impossible
// it fails at once: a goroutine of the connector blocked after both
// halves closed, or 100 steps in a row with nothing in flight while the
// connector still keeps blocks. Where every half is a connector.Waker the
// harness blocks on the wake-up channels as an engine does, and also
// steps now and then as an engine that polls: ten steps that find news
// of the connectors' work with no wake-up before them and no goroutine of
// the process running (so none can still be sending one) fail the run at
// once, as a connector that never wakes the engine.
//
// # Concurrency
//
// Run drives every engine from the test's goroutine; the connector may run
// transfers on goroutines of its own. Run may run in parallel with other
// tests: it counts as the connector's only the goroutines it started,
// directly or through goroutines it started.
package connectortest
