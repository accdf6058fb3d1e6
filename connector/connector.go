package connector

import (
	"context"
	"log/slog"
	"time"

	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// RequestID names a request for as long as the connector knows it: from its
// first Match until Finish returns keep == false or a Progress releases it.
type RequestID string

// BlockID is the index of a block in the engine's paged KV memory, the same
// in every worker. With several KV cache groups (see [KVCache].Groups),
// each group has its own memory and its own block ids.
type BlockID int32

// NoBlock marks an entry of a block table that holds no block: in a
// sliding-window group, a block that fell out of the window and was freed;
// in a state group, a block boundary whose state the engine did not keep.
// The connector neither loads into nor saves from such an entry. It is
// vLLM's null block.
const NoBlock BlockID = -1

// Request is the scheduler half's view of one engine request.
//
// The engine owns the Request and its slices; the connector reads them
// during a call only and never retains them. Hashes grow as the engine
// hashes new full blocks (see [hashing.Chain]); earlier entries never change.
type Request struct {
	ID RequestID

	// Prompt is the number of tokens the engine must prefill: the prompt,
	// or for a request resumed after preemption, the prompt and the tokens
	// generated so far. A match never covers the last of them: the engine
	// must compute at least one token to sample.
	Prompt int

	// Hashes are the block hashes of the request's full blocks so far, in
	// order: Hashes[i] covers tokens [i*B, (i+1)*B) for block size B. For
	// Match, exactly one per full block of Prompt (Prompt / B of them).
	Hashes []hashing.BlockHash

	// Tokens, optional, are the request's tokens, at least those of its
	// full blocks: Tokens[i*B:(i+1)*B] are block i's. A connector that
	// publishes KV events ([EventSource]) copies those of the blocks it
	// saves into its BlockStored events, for routers that hash tokens
	// with functions of their own. Nil: the events carry no tokens.
	Tokens []hashing.Token

	// TransferParams are the opaque transfer parameters the request
	// arrived with (vLLM's kv_transfer_params): what the instance that ran
	// its prefill returned, from its connector's [TransferParamsSource].
	// Connectors that do not use them ignore them.
	TransferParams []byte
}

// Preempter is an optional interface of a Planner: Preempt ends r as
// Finish does, for a request the engine preempted and will run again
// later. A connector whose Finish hands a finished request's KV on to
// another instance (disaggregated prefill) hands nothing on for a
// preempted one, and keeps only the blocks that transfers still touch.
// Fallback: Finish.
type Preempter interface {
	Preempt(r *Request, blocks ...[]BlockID) (keep bool, err error)
}

// TransferParamsSource is an optional interface of a Planner whose
// requests continue on another instance (disaggregated prefill and
// decode). After Finish kept a request's blocks, TransferParams returns the
// parameters the engine hands on with the request, for the instance that
// continues it (its Request.TransferParams); they are valid until the
// request is released. Fallback: nothing is handed over, and the other
// instance computes the prompt itself.
type TransferParamsSource interface {
	TransferParams(id RequestID) ([]byte, error)
}

// Match is the scheduler half's answer to "how many further tokens does the
// store hold for this request?".
type Match struct {
	// Tokens is the number of tokens, beyond those the engine already has,
	// from which the store can resume the request for every shard: a whole
	// number of blocks (for a hybrid layout, what each KV cache group
	// needs to resume there; see "Block tables" in the package doc).
	Tokens int
	// Pending is true while an asynchronous lookup runs; Tokens is then 0
	// and the engine asks again in a later step.
	Pending bool
}

// Planner is the scheduler half of a connector. The engine drives it from
// its scheduling loop, in this order each step:
//
//	for each waiting request: Match, then (if the engine admits it) Allocated
//	for each request that runs this step: Scheduled
//	m := Plan()        // ship m to every worker
//	... workers run the step and report their Outputs ...
//	p, err := Update(outputs) // act on p.Loaded, p.Failed, p.Released
//	for each request that ends: Finish
//
// No method blocks on I/O: lookups run in the background and Match answers
// Pending until they finish. A Planner is not safe for concurrent use; the
// engine calls it from its one scheduling goroutine. Close may be called
// from any goroutine, once the loop has stopped.
type Planner interface {
	// Match reports how many tokens beyond computed the store holds for r,
	// where computed is the number of tokens the engine already has (its
	// local prefix-cache hit, a whole number of blocks). The answer is the
	// longest prefix the request can resume from with what the store holds
	// for every shard (with one full-attention group, the longest run of
	// blocks present), never covering the last prompt token. The first call for a request starts
	// a lookup and may answer Pending; later calls answer from that lookup.
	Match(r *Request, computed int) (Match, error)

	// Allocated tells the connector which blocks the engine allocated for r
	// after a Match: external is the number of tokens (from computed on) to
	// load from the store, 0 for none, and blocks holds r's block table,
	// one per KV cache group (see "Block tables" in the package doc):
	// with one group, blocks[0][i] holds tokens [i*B, (i+1)*B), for every
	// block of the request so far. A load is planned in the next Plan; the
	// engine must not run r until Progress lists it as loaded or failed,
	// unless every worker is a [LayerWorker]: r may then run in the step
	// whose Metadata carries the load, layer by layer after WaitLayer, and
	// what that step computed for r counts only once a Progress lists r
	// as loaded (see LayerWorker). The connector then saves the blocks
	// that step computed only after every worker reported the load.
	Allocated(r *Request, external int, blocks ...[]BlockID) error

	// Scheduled tells the connector that after this step the first computed
	// tokens of r will be in its blocks, one block table per group as in
	// Allocated. Full blocks that the store lacks are saved by the workers
	// once the step's compute is ready. Call it only for requests that
	// compute this step, after the step's last preemption decision: a block
	// named here is saved, so it must hold the KV of its tokens (for a state
	// group, the state at its end) when the step is ready.
	Scheduled(r *Request, computed int, blocks ...[]BlockID) error

	// Plan returns the step's Metadata, to be shipped to every worker. It
	// is called once per step. The Metadata is owned by the connector,
	// read-only, and valid until the next Plan; encode or copy it to keep
	// it (see "Ownership" in the package doc).
	Plan() *Metadata

	// Update consumes the Outputs that workers reported since the last
	// Update (any number per worker, in any order) and returns what the
	// engine must act on. The Progress is owned by the connector, read-only,
	// and valid until the next Update.
	Update(outs []*Output) (*Progress, error)

	// Finish ends r in the connector: finished, aborted or preempted. keep
	// is true when transfers still touch its blocks: the engine must not
	// reuse them until a Progress lists r in Released. A request ID may be
	// used again only once Finish returned keep == false or r was released.
	// Finish of a request the connector never saw (no Match or Scheduled)
	// returns false and no error. blocks are r's block tables, as in
	// Allocated; a request that holds no blocks may pass none.
	Finish(r *Request, blocks ...[]BlockID) (keep bool, err error)

	// Close stops background lookups and releases resources. It is
	// idempotent and joins every goroutine the Planner started. It does
	// not drain: the requests whose blocks it kept (Finish returned keep)
	// are forgotten with their saves; an engine drains first (step until
	// no block is kept, as scheduler.Scheduler.Drain does), then closes
	// the workers and this half.
	Close() error
}

// Progress is what the engine must act on after an Update. Loaded and
// Failed may name a request that was finished while its load ran: the
// engine ignores those. Within one Progress, act on Loaded and Failed before
// Released.
type Progress struct {
	// Loaded lists requests whose planned loads finished in every worker:
	// their blocks hold the stored KV and the requests may run.
	Loaded []RequestID
	// Failed lists requests whose loads failed, in part or whole.
	Failed []LoadFailure
	// Released lists finished requests whose blocks no transfer touches any
	// more: the engine may free them now.
	Released []RequestID
}

// LoadFailure says how much of a request's KV survived a failed load.
type LoadFailure struct {
	Req RequestID
	// Valid is the number of tokens whose KV is in the request's blocks,
	// counted from the request's first token (so it includes the engine's
	// own local hit): with full attention only, everything before the
	// first block that failed in any worker; in a hybrid layout, where a
	// window or a state is of no use without the rest, the connector may
	// count only the local hit.
	Valid int
	// Fail is true under [PolicyFail]: the engine must fail the request.
	// Otherwise ([PolicyRecompute]) it rolls the request back to Valid
	// tokens and recomputes the rest.
	Fail bool
}

// Worker is the worker half of a connector: it owns one worker's KV memory
// and moves block bytes between it and the store. The engine calls it from
// its worker loop, each step:
//
//	w.Start(ctx, m)    // starts the step's loads; returns at once
//	... run the step's compute ...
//	w.Save(ctx, ready) // saves the step's new blocks once ready fires
//	out := w.Poll()    // ship out to the scheduler
//
// Start, Save and Poll do not block on transfers, which run on goroutines
// the Worker owns. A Worker is not safe for concurrent use, except Close.
type Worker interface {
	// Register hands the worker its KV memory and layout. It is called once,
	// before the first Start.
	Register(kv KVCache) error

	// Start validates m and starts its loads straight into the registered
	// blocks. The step's saves are recorded for the next Save. ctx bounds
	// the call, not the transfers, which end at Close.
	Start(ctx context.Context, m *Metadata) error

	// Save starts the saves of the last Started Metadata; they read the
	// blocks only once ready reports done. The worker keeps ready after
	// the call, and queries or waits on it until it reports done (or fails),
	// never after: an engine that recycles its events (a pool of CUDA
	// events, say) may reuse ready once a later Poll has reported every
	// save of that Metadata, or once Close returned.
	Save(ctx context.Context, ready Event) error

	// Poll returns the transfers that finished since the last Poll. The
	// Output is owned by the Worker and valid until the next Poll.
	Poll() *Output

	// Close cancels queued transfers, waits for running ones, and releases
	// resources. It is idempotent. Transfers it cancels are never reported
	// and a save it cancels is lost: Close does not drain. An engine that
	// stops drains first, stepping until every save was reported
	// (scheduler.Scheduler.Drain), then closes the workers and the
	// scheduler half together.
	Close() error
}

// LayerWorker is an optional interface of a [Worker] that moves KV layer
// by layer, so that a step's compute overlaps its transfers: the forward
// pass starts on layer 0 while later layers still load, and each layer is
// saved as soon as it is computed (vLLM's wait_for_layer_load and
// save_kv_layer). Layers are the model's, [0, hashing.Layout.Layers), in
// the order the forward pass computes them; with several KV cache groups
// a layer belongs to the group that lists it (hashing.Group.Layers).
//
// An engine whose workers are all LayerWorkers may run a request in the
// step whose Metadata carries its load, instead of waiting for a Progress
// that lists it loaded (see [Planner].Allocated). Each step it calls,
// after Start:
//
//	for l := range layers {
//		w.WaitLayer(ctx, l)        // layer l of the step's loads is in
//		... compute layer l ...
//		w.SaveLayer(ctx, l, ready) // layer l's saves may start once ready fires
//	}
//	w.Save(ctx, ready)              // saves what SaveLayer did not start
//	out := w.Poll()
//
// The Poll after WaitLayer of the last layer reports every load of the
// step, Done or Failed. A load that failed in any worker (Progress.Failed)
// leaves its request's KV unknown for that step on every rank (tensor
// parallelism mixes the ranks' results): the engine discards what the
// step computed for the request and rolls it back to LoadFailure.Valid. A
// scheduler half therefore saves nothing a request computed in the step
// of its load until every worker reported the load: it plans those saves
// once the load is confirmed, in a later Metadata, and only when the
// Outputs of that step itself confirm it. A load reported later ended
// after the step read its blocks, so the step's work is void: the engine
// discards it, the request waits for the load as for a whole one, and the
// blocks after the load's go back to the pool.
//
// Fallback: a Worker that is not a LayerWorker loads a request's blocks
// whole before the request runs, and saves them after the step.
type LayerWorker interface {
	Worker

	// WaitLayer blocks until layer l, and every layer before it, of every
	// load the last Start began is in KV memory, or its load failed (the
	// next Poll reports the failure). If ctx is done before that it
	// returns ctx's error, and [ErrClosed] once the worker is closed; the
	// same layer may then be waited on again. Within a step, layers are
	// waited on in increasing order, each at most once until a wait
	// returns nil; skipping layers is allowed (waiting for l waits for
	// every layer before it). A layer out of range, or waited on again or
	// out of order, is an error naming the layer.
	WaitLayer(ctx context.Context, l int) error

	// SaveLayer starts the saves of layer l, and of every layer before it
	// not yet started, of the last Started Metadata; they read the blocks
	// only once ready reports done (ready is kept as [Worker].Save keeps
	// it). Within a step, layers are saved in increasing order, each at
	// most once, and Save afterwards starts what is left. A layer out of
	// range, or saved again or out of order, is an error naming the layer.
	SaveLayer(ctx context.Context, l int, ready Event) error
}

// Event is a step's readiness signal: on a GPU, a CUDA event recorded after
// the step's compute; on a CPU, [Ready]. Query must not block.
type Event interface {
	Query() (done bool, err error)
}

// Waiter is an optional interface of an [Event] that can also be waited for
// without polling (cudaEventSynchronize, say). A worker that has one waits on
// its own goroutine instead of polling Query.
type Waiter interface {
	Wait(ctx context.Context) error
}

// Ready is an Event that is always done: the readiness of CPU compute, which
// has finished by the time the engine calls Save.
var Ready Event = ready{}

type ready struct{}

func (ready) Query() (bool, error) { return true, nil }

// Driver opens the two halves of one kind of connector. Drivers register
// themselves with [Register] under a name that configs use.
type Driver interface {
	OpenPlanner(cfg Config, env Env) (Planner, error)
	OpenWorker(cfg Config, env Env) (Worker, error)
}

// Env carries what the engine knows and the config does not.
type Env struct {
	// Identity is the namespace identity: every key the connector reads or
	// writes is bound to it. Required.
	Identity hashing.Identity

	// Rank is the worker's tensor-parallel rank (worker half only).
	Rank int

	// Blocks, when not 0, is the number of KV blocks in the engine's pool
	// (each worker's KVCache.Blocks): the scheduler half then refuses a
	// block id outside [0, Blocks) in the call that names it, rather than
	// a worker refusing the step's Metadata later. With several KV cache
	// groups it bounds every group's ids, unless GroupBlocks is set.
	Blocks int

	// GroupBlocks, when not nil, holds for each KV cache group the number
	// of blocks in its pool (KVCache.Groups[g].Blocks), one entry per
	// group; 0 for a group whose size is not given. It takes the place of
	// Blocks for a layout whose groups have pools of different sizes.
	GroupBlocks []int

	// Store, when not nil, is an open store the connector uses instead of
	// opening one from its config: the embedded store that the scheduler
	// half and in-process workers share. The connector does not close it.
	Store store.Store

	// Copier, when the worker's KV memory is device memory that the store
	// cannot reach, stages blocks through registered host memory: a
	// *cudacopy.Copier (connector/cudacopy) is one. Worker half only; the
	// connector does not close it.
	Copier DeviceCopier

	// Logger receives the connector's logs; nil discards them.
	Logger *slog.Logger

	// Engine, when not nil, is the worker's transfer engine, for
	// connectors that move blocks between instances themselves rather
	// than through a store (connector/p2p). Worker half only; the
	// connector does not close it.
	Engine rdma.Engine

	// Values carries what a driver needs beyond these fields, under keys
	// of the driver's own unexported types (as context values are), so
	// that a third-party connector can be opened by name without a field
	// here for it. Drivers document their keys; a driver ignores keys it
	// does not know.
	Values map[any]any
}

// DeviceCopy is one copy of N bytes from Src to Dst, between device memory
// and host memory. Both are addresses outside the Go heap (device memory,
// pinned or mapped host memory): the copy runs after the call that issues
// it returns. It is a struct of its own, not cudart's type, so that fields
// can be added; connector/cudacopy turns it into cudart's.
type DeviceCopy struct {
	Dst, Src uintptr
	N        int
}

// DeviceCopier moves block bytes between device KV memory and host staging
// memory (connector/cudacopy's Copier is one, over CUDA streams). Copies
// may run asynchronously: each call issues one batch and returns its
// [CopyCompletion], which completes when exactly the copies of that batch
// have, not those that other calls issued before or after. A worker's
// transfer goroutines share the copier and each waits only for its own
// batches, so it must be safe for concurrent use, and one goroutine's
// batch must never have to wait for another's.
//
// The copies slice is read during the call only; the caller keeps it.
// When issuing fails part-way, the call returns the error together with a
// completion that covers the copies it did issue: done is nil only when
// err is not and no copy was issued. A caller reuses or frees memory that
// a batch touches only after Wait of its completion returned nil.
type DeviceCopier interface {
	CopyToHost(copies []DeviceCopy) (done CopyCompletion, err error)
	CopyToDevice(copies []DeviceCopy) (done CopyCompletion, err error)
}

// CopyCompletion is the completion of one batch of device copies, from a
// [DeviceCopier]. Wait blocks until every copy of the batch has completed
// and returns nil, or returns the error that the device reported for
// them, or ctx.Err() once ctx is done (the copies go on; Wait may be
// called again). After an error other than ctx's the state of the memory
// is unknown: the caller never reuses or frees it. Once Wait returned nil
// the copier may recycle what the batch used, and later calls of Wait
// return nil at once. The connector calls Wait from one goroutine at a
// time, and on every completion it gets, until it returns nil or an error
// other than ctx's.
type CopyCompletion interface {
	Wait(ctx context.Context) error
}

// HostPinner is an optional interface of a [DeviceCopier] that can
// page-lock ("pin") host memory, so device copies from and to it run at
// full speed and asynchronously; copies from pageable memory are staged by
// the driver and run at a fraction of the bandwidth. A connector that
// allocates host staging buffers pins them with PinHost once and unpins
// them with UnpinHost before it frees them, after the completion of every
// batch that copied into or out of them returned nil from Wait.
// connector/cudacopy's Copier is a HostPinner.
type HostPinner interface {
	PinHost(addr uintptr, n int) error
	UnpinHost(addr uintptr) error
}

// Stats are a connector's counters, from the optional [StatsReporter].
type Stats struct {
	Lookups        int64 // exists probes started
	LookupKeys     int64 // keys probed
	HitBlocks      int64 // blocks matched from the store
	HitTokens      int64 // tokens matched from the store
	Loads          int64 // blocks loaded
	LoadBytes      int64 // bytes loaded
	LoadFailures   int64 // worker: blocks whose load failed; scheduler half: blocks discarded because a load failed: from LoadFailure.Valid to the end of the load
	Saves          int64 // blocks saved
	SaveBytes      int64 // bytes saved
	SaveSkipped    int64 // blocks not saved because the store had them
	SaveFailures   int64 // blocks whose save failed for good
	SaveRetries    int64 // blocks requeued after an out-of-space put
	StagedBytes    int64 // bytes copied through a staging buffer
	LookupNanos    int64 // time spent in lookups' store calls (a call several lookups share counts once)
	TransferNanos  int64 // time spent in loads and saves
	StaleDiscarded int64 // blocks of transfers of an old generation dropped
	Corrupt        int64 // blocks whose loaded bytes failed verification (also in LoadFailures)
	StoreErrors    int64 // store calls that failed (timeouts included): a failed lookup is a miss, a failed load failed blocks
	StoreTimeouts  int64 // store calls that ran past their deadline (also in StoreErrors)
	FailedSkipped  int64 // blocks a lookup found but not matched: their load failed lately
	Refused        int64 // transfer parameters refused (p2p): malformed, of another identity, forged, or unverifiable
	Resyncs        int64 // AllCleared events announced because the store's feed of key events (store.Watcher) lost events: routers rebuild from nothing
	SlowSkipped    int64 // blocks a lookup found but not matched: loads ran slower than the engine's prefill (storeconn's prefill_tokens_per_s); with a store in tiers, loads from the tier that holds them

	// The LoadTokens fields are, in a worker, the tokens of the blocks it
	// loaded (Loads × Layout.BlockSize) by the medium of the store tier
	// that served them, in vLLM's KV-event vocabulary
	// (store.KeyEvent.Medium): the tokens each tier actually delivered,
	// where HitTokens counts those a match promised. Only a store that
	// says which tier served a key (store.Layered, as store/tiered) fills
	// them; from any other they are zero. A block stored in several
	// values (layer chunks) counts in the medium of the lowest tier that
	// served one. Like every field of Stats they are int64 counts, so a
	// Stats copies whole, shares nothing, and sums field by field.
	LoadTokensCPU     int64 // "CPU": host memory (store/memstore)
	LoadTokensDisk    int64 // "DISK": local disk (store/diskstore)
	LoadTokensStorage int64 // "STORAGE": a remote store (store/remote, store/mooncake)
	LoadTokensOther   int64 // a tier of any other medium
}

// Health is a connector half's view of the store or transport it depends
// on, from the optional [HealthReporter]. Inference goes on while it is
// failing (a failed lookup is a miss, a failed load is recomputed); Health
// is how an engine or an operator sees that it is.
type Health struct {
	ConsecutiveFailures int64     // calls that failed since the last one that succeeded
	Failures            int64     // calls that failed, ever
	LastError           error     // the latest failure, naming the operation; nil if none
	LastErrorTime       time.Time // when it happened
}

// Healthy reports whether the latest call succeeded.
func (h Health) Healthy() bool { return h.ConsecutiveFailures == 0 }

// HealthReporter is an optional interface of a Planner or Worker. Health
// may be called from any goroutine.
type HealthReporter interface {
	Health() Health
}

// StatsReporter is an optional interface of a Planner or Worker. A
// Planner's Stats is called from the engine's scheduling goroutine, as
// its other methods are; a Worker's from any goroutine.
type StatsReporter interface {
	Stats() Stats
}

// Waker is an optional interface of a Planner or Worker: a way for an
// engine with nothing to compute to block until the connector has news,
// instead of stepping idle. Wake returns a channel, the same on every
// call, that receives a value once something happened that the half's
// next calls may report: for a Worker, a transfer ended (the next Poll
// reports it); for a Planner, a lookup answered or reached its deadline
// (a Match that answered Pending may answer now), or work waits that only
// a step can start (an out-of-space retry due in a later step). Values
// coalesce: the channel holds at most one, so a value means "call again",
// and a call may find nothing new.
//
// An engine waits only when it has nothing to compute and has called the
// halves since its last receive (a value sent before that call is still
// in the channel, so no news is lost between the call and the wait), on
// the channels of the Planner and of every Worker together, and on its
// own arrivals. A half that is not a Waker cannot be waited on: the
// fallback is to step, polling, as without Waker.
//
// Close of the half closes the channel, so that a wait on it returns
// (scheduler.Scheduler.Wait then returns an error wrapping [ErrClosed]);
// an implementation that does not leaves such a wait to its context.
type Waker interface {
	Wake() <-chan struct{}
}

// Rotator is an optional interface of a Planner: after an online weight
// update, Rotate moves the connector to a new weights generation. From the
// next Plan on no key of an older generation is looked up, loaded or saved,
// in the scheduler half or in any worker (the Metadata carries the
// generation). The engine must also drop its own prefix cache and recompute
// running requests: their KV came from the old weights. Generations only
// move forward: Rotate to a generation that is not greater than the current
// one returns an error wrapping [ErrGeneration] and changes nothing.
type Rotator interface {
	Rotate(generation uint64) error
}

// KVEventKind is what happened to a block in the store.
type KVEventKind uint8

const (
	BlockStored  KVEventKind = iota + 1 // a block was saved
	BlockRemoved                        // a block was removed or evicted
	AllCleared                          // every block of the namespace is gone
)

// KVEvent is a change of the store's contents, as KV-aware routers consume
// them.
type KVEvent struct {
	Kind       KVEventKind
	Generation uint64
	Group      int                 // the KV cache group of the blocks; 0 with one group
	Hashes     []hashing.BlockHash // the blocks, for BlockStored and BlockRemoved
	// For BlockStored: the blocks are consecutive blocks of one request,
	// Parent is the hash of the block before Hashes[0] in it (the zero
	// BlockHash when Hashes[0] is its first block), BlockSize the tokens
	// per block, and Tokens, when the request's Request.Tokens were given,
	// the tokens of the blocks in order, BlockSize per block (nil
	// otherwise).
	Parent    hashing.BlockHash
	BlockSize int
	Tokens    []hashing.Token
	// Medium names the tier of a store in tiers that the blocks reached
	// or left, in vLLM's vocabulary ("CPU", "DISK", "STORAGE"; see
	// [store.KeyEvent]); "" is the store's first tier, whose name the
	// event publisher's configuration gives.
	Medium string
}

// EventSource is an optional interface of a Planner: TakeEvents appends the
// KV events since the last call to dst and returns it.
type EventSource interface {
	TakeEvents(dst []KVEvent) []KVEvent
}

// Unsaved names blocks of one request that a Planner planned to save and
// that no Update has yet reported stored or failed for good: saves in
// flight in the workers, and out-of-space retries waiting for their step.
type Unsaved struct {
	Req    RequestID
	Group  int                 // the KV cache group of the blocks; 0 with one group
	First  int                 // the index of the first block in the request
	Hashes []hashing.BlockHash // the blocks, consecutive from First
}

// UnsavedReporter is an optional interface of a Planner: Unsaved
// appends to dst every block whose save the half planned and no Update
// has reported, ordered by request, group and first block, and returns
// it. An engine that stops (scheduler.Scheduler.Drain) calls it once its
// deadline has passed, to learn which saves its Close will lose: a
// [Worker]'s Close cancels what it has not started, and a save that no
// Output reported is not known to be in the store. The slices are the
// caller's. Fallback: the engine knows only which requests' blocks the
// connector still keeps (Finish returned keep and no Progress released
// them).
type UnsavedReporter interface {
	Unsaved(dst []Unsaved) []Unsaved
}

// Namespacer is an optional interface of a Planner: Namespace returns
// the namespace of the identity the half was opened with (Env.Identity),
// at its current generation. An engine's scheduler compares it with its
// own (scheduler.New), so that it never drives a connector opened for
// another identity, whose keys would not be its blocks'. Fallback: nothing
// is compared.
type Namespacer interface {
	Namespace() hashing.Namespace
}
