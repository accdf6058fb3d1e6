// Package storeconn is the reference connector: it shares KV blocks through
// any [store.Store], the embedded memstore or Mooncake Store alike. Import
// it for its side effect of registering the driver under [Name]
// ("StoreConnector") and open its halves by name (connector.OpenPlanner
// and connector.OpenWorker), or open them directly with [OpenPlanner]
// and [OpenWorker], which return the concrete [*Planner] and [*Worker].
//
// Besides connector.Planner, the *Planner is a connector.Rotator,
// EventSource, StatsReporter, HealthReporter, Waker, UnsavedReporter and
// Namespacer; the *Worker is a connector.LayerWorker, StatsReporter,
// HealthReporter and Waker. Close of either half closes its Wake channel.
// Neither Close drains: a worker's cancels the transfers it has not
// started (an engine drains first, scheduler.Scheduler.Drain).
//
// # What it does
//
// Lookup: Match probes the store once per request (one batch exists over
// every block beyond the engine's local hit and every KV shard), on a
// bounded pool of goroutines, and answers Pending until the probe is done.
// The answer is the longest run of blocks present in every shard (for a
// hybrid layout, the longest point every group can resume from: see KV
// cache groups), never the last prompt token, so every rank of a
// tensor-parallel group sees the same hit. The result is kept per request: a pending answer is not asked twice.
// The lookups queued while the pool waits on the store share its next
// call (up to 4096 keys): over a store whose calls are round trips, the
// requests matched in one step cost one call, not one each.
//
// Loads go straight from the store into the engine's blocks, or through a
// registered staging buffer where the memory's shape or the store needs it
// (see Verification).
// Saves wait for the step's ready event, copy only full blocks, skip blocks
// that the store is known to hold or that another request is saving, and
// are striped across KV-head replicas so each block is written by exactly
// one rank. A put that finds no space stops that request's saves for the
// step; the blocks are planned again in a later step, up to save_retries
// times, and every failure is counted. A retry goes out only for the
// blocks that the request's tables, as the engine last passed them, still
// hold: a sliding-window block the engine freed since (NoBlock) may hold
// another request's KV.
//
// A block that fails to load is reported as a failed block, through
// Progress.Failed, no later than the step in which the request's loads are
// reported done, with the policy (recompute or fail) applied.
//
// # KV cache groups
//
// A hybrid layout (hashing.Layout.Groups) is served group by group: each
// group has its own keys (hashing.Namespace.GroupKey), its own block table
// in the calls and its own memory in the worker (connector.KVCache.Groups).
// A lookup probes every group's blocks; the match is the longest block
// boundary every group can resume from (all blocks for full attention, the
// window before it for a sliding window, the state after its last block
// for a state group), and the load moves exactly those blocks, one
// transfer per group. Saves skip connector.NoBlock entries. A failed load
// of a hybrid request leaves only its local blocks valid (a window or a
// state is of no use without the rest); with full attention only, every
// block before the first that failed. State groups are saved by every rank
// (each holds its own part), attention groups striped across replicas.
// Every group's block size must equal Layout.BlockSize; another is refused
// when the scheduler half opens.
//
// Rotate moves every key to a new weights generation: from the next step
// on nothing of an older generation is looked up, loaded or saved; saves of
// an older generation still queued in a worker are dropped (ReasonStale),
// never written under the new one. Generations only move forward: Rotate
// to an older or the same generation, and a worker's Start of a Metadata
// older than one it has run, return an error wrapping
// [connector.ErrGeneration] and change nothing.
//
// # Layer-wise transfers
//
// The Worker is a [connector.LayerWorker]. With "layer_chunks": n > 1,
// each block is stored as n values (per group, min(n, its layers)), each
// holding a range of consecutive layers under its layer-range key
// (hashing.Namespace.LayerKey), with its own trailer. A step's loads then
// go chunk after chunk in layer order, on one transfer goroutine, so that
// the first layers arrive first at the store's full speed: WaitLayer(l)
// returns once the chunks holding layers up to l are in, while the
// forward pass computes them and later chunks load. SaveLayer(l) queues
// the chunks whose last layer is l or earlier, each read once its own
// ready event fires. A lookup probes every chunk of every block: a block
// is present only when all its values are.
//
// A request that runs in the step of its load has the blocks it computed
// in that step saved only once every worker reported the load, in the
// next Metadata; a failed load drops them, since they were computed over
// KV that did not arrive.
//
// With layer_chunks 1 (the default) a block is one value under its plain
// key: WaitLayer waits for the whole of the step's loads and SaveLayer
// queues a block once its last layer is saved. The two layouts use
// different keys: engines sharing a namespace use the same layer_chunks,
// or they miss each other's blocks (never read wrong bytes). Coinciding
// layer ranges share keys across settings. Many chunks cost a store call
// per chunk (BenchmarkLayerwiseTTFT and BenchmarkLayerChunksSave measure
// the trade).
//
// # Verification
//
// With "verify": "checksum" (the default) every value the connector saves
// is the block's bytes followed by a 24-byte trailer: a magic and version,
// the block's length, a CRC-32 of the block and a 64-bit digest of the key
// it is saved under. Every load checks all of it before the block counts as
// loaded: a value of the wrong size, a trailer for another key, or bytes
// whose CRC differs (a torn read, a store that handed out reused memory, a
// bit flipped in flight) fail the block with [connector.ReasonCorrupt]. It
// is counted in Stats.Corrupt (and LoadFailures), logged at warn level at
// most once a second (with the number of lines suppressed), and the engine
// recomputes the block or fails the request, as its policy says. Never is
// a block that fails the check reported loaded.
//
// Over a store that implements [store.Vectored] (memstore does) the
// trailer travels beside the block with no copy: the store gathers the
// block's spans and the trailer into one value and scatters it back. Over
// other stores (Mooncake's C API has no gather/scatter) a value with a
// trailer is staged through a registered host buffer: one more copy each
// way, counted in StagedBytes. Device KV memory is always staged.
//
// With "verify": "mac" the trailer is 40 bytes: a magic and version, the
// block's length, and a keyed BLAKE3-256 of the key and the block, keyed
// with the tenant's secret: 32 bytes given as 64 hex digits in
// kv_connector_extra_config "verify_key" or, without it, in the
// environment variable KVCONNECT_VERIFY_KEY ([VerifyKeyEnv]; for example
// `openssl rand -hex 32`). The secret is never logged, never in an error,
// and a connector.Config prints it as "[secret]". A load checks the MAC as
// it checks the CRC, with the same failures (ReasonCorrupt, Stats.Corrupt).
// The engines of one tenant share the secret; engines of different
// tenants on one store use different secrets.
//
// Which mode holds against what:
//
//   - "none": nothing. A torn or reused value, or one another writer put
//     under the key, loads as the block: wrong KV, silently.
//   - "checksum": accidents. A torn read, a bit flipped in flight, a value
//     of another key (a routing bug, a store that reused memory) fail the
//     block. Anyone who can write the store can still plant a value with a
//     valid trailer: keys follow from public facts (the model, the
//     tokens), and CRC-32 and FNV-1a are not secrets.
//   - "mac": accidents, and every writer that does not hold the tenant's
//     secret: another tenant's engine on the same store (a Mooncake master,
//     a store/remote server), any process that reaches the store's port.
//     A value it planted, copied from another key, or saved with a valid
//     CRC trailer fails as Corrupt and is never loaded. What "mac" does
//     not stop: a holder of the secret (every engine of the tenant is
//     trusted), a writer that removes or overwrites values (loads then
//     miss or fail and the engine recomputes: a loss of hits, never wrong
//     KV), and a store that replays an old value the tenant itself saved
//     under the same key (the same bytes: block keys name their content).
//
// Use "checksum" for a store that only the tenant's own engines can write
// (a private memstore, one engine's store/remote server on a unix
// socket); "mac" whenever another party can write the store; "none" only
// to measure the trailer's cost. The MAC's cost is one keyed BLAKE3 pass
// over the block on each save and each load, on the transfer goroutines:
// BenchmarkTrailer measured 1.3 to 1.45 GB/s per core against CRC-32's 12
// to 17 GB/s (2-core virtual machine, AVX2), and BenchmarkVerify's loads
// over memstore ran at 0.2 times the speed of unverified ones, "checksum"
// at 0.8 times; with a store that is slower than memory the share is
// smaller. See SECURITY.md at the repository's root for the threat model.
//
// "verify": "none" saves and loads raw blocks, with no trailer and no
// check. The formats do not mix: a verifying loader refuses a raw value
// (wrong size), "checksum" and "mac" refuse each other's values (their
// trailers differ in size), and a raw loader cannot read a value with a
// trailer (the value is larger than its block), so engines sharing a store
// and a namespace must agree on the setting; a mismatch costs hits, never
// wrong bytes, and shows as load failures: Corrupt for a raw value read
// with verification, a store error (buffer too small) the other way round.
//
// # Device memory
//
// Staging buffers for device KV memory are pinned through Env.Copier when
// it is a [connector.HostPinner] (connector/cudacopy's Copier is), so
// copies run at full bandwidth. Each transfer goroutine stages through a
// buffer of its own and waits for the completion of its own batch of
// copies only, so goroutines never wait for each other's copies. A
// buffer is reused, unpinned or unmapped only after that wait, made
// without cancellation, has returned nil, also after a batch of copies
// that failed part-way and also in Close: a copy still queued never lands
// in memory that was freed, nor in a block the engine is recomputing. If
// the wait itself fails, the device's state is unknown and the buffer is
// retired: kept, never reused or unmapped.
//
// # KV events
//
// The scheduler half is a [connector.EventSource]. A save that every worker
// stored is announced in a BlockStored event (the blocks, their parent, the
// block size and, when the Request has them, the tokens). Within and across
// the batches TakeEvents returns, a block's BlockStored comes after the
// event that stores its parent in its group: an event whose parent's save
// is still in flight waits for that save to end (stored or failed).
//
// When the store implements [store.Watcher] (memstore does) and the half
// saves, it watches the store with a feed of watch_buffer events and turns
// the keys of its own namespace that leave the store into BlockRemoved
// events with the key's KV cache group: once per block, when the first of
// its shard or chunk keys leaves, for blocks it announced stored and has
// not announced removed. A key that leaves while the save that put it is
// in flight is announced after that save's BlockStored, and a key that
// left and was put again by the save is not announced. So a router that
// adds BlockStored blocks, removes BlockRemoved ones and empties on
// AllCleared holds exactly the blocks whose every key the store holds
// (TestRouterIndexMemstore checks it after heavy eviction). That needs
// the store's feed to hold, when a put returns, every event of its keys
// that happened before it (memstore announces under the key's lock); a
// store whose events come later may make the router lack a block the store
// holds, never hold one it lacks. Keys of other namespaces (other models,
// tenants or generations) are not this half's to announce.
//
// A store in tiers names the tier of each key event (store.KeyEvent.Medium):
// a key leaving a tier is a BlockRemoved of that medium, and a key reaching
// a lower tier is a BlockStored of that medium, announced only for a block
// announced stored before (its parent and tokens repeated); the half's own
// saves carry Medium "", the publisher's medium, which names the store's
// first tier. The key events of a tier other than the first are not
// tracked while a save is in flight.
//
// When the feed overflows (the engine did not step for watch_buffer
// events) the half announces AllCleared, counts it in Stats.Resyncs and
// starts again from nothing: blocks announced before are no longer
// removable, so the router may lack blocks the store holds, never hold
// blocks it lacks. It does the same if it tracks more than 4,194,304
// blocks. A store that is not a Watcher (Mooncake) gets no BlockRemoved:
// see its package doc.
//
// # Configuration
//
// kv_connector_extra_config keys: "lookup" ("async", the default, or "sync"
// to probe inside Match: fine for the embedded store), "lookup_workers" (2),
// "lookup_queue" (256), "transfer_workers" (2), "batch_blocks" (64 blocks
// per store call), "save_retries" (3), "retry_steps" (1), "event_poll"
// ("50us", the first interval at which a ready event is polled), "verify"
// ("checksum", the default, "mac" or "none"; see Verification),
// "verify_key" (verify "mac"'s secret, 64 hex digits), "store_timeout"
// ("5s", the deadline of every store call), "verify_chunk" (1048576: the
// bytes a verified load asks a gathering store for in one call, so each
// value is checked while it is still in the CPU's cache; 0 asks for
// batch_blocks values at once, for a store whose calls are round trips),
// "failed_ttl" ("15s", how long a
// block whose load failed is not planned again), "layer_chunks" (1: the
// values a block is stored as, for layer-wise transfers; see Layer-wise
// transfers), "watch_buffer" (65536, at most store.MaxWatch: the key
// events of a watched store held between two steps; see KV events),
// "event_buffer" (65536, at most 2^24: the KV events held for TakeEvents;
// past it they are dropped and replaced by one AllCleared, counted in
// Stats.Resyncs, so an engine that never takes them holds a bounded
// number),
// "prefill_tokens_per_s" (0; see Loads slower than
// prefill). Any other key is an error naming it, with the nearest known
// key. Every count has an upper bound as well (lookup_workers and
// transfer_workers 256, lookup_queue and batch_blocks 65536, save_retries
// 100, retry_steps 1048576, verify_chunk 1 GiB, layer_chunks 1024,
// watch_buffer store.MaxWatch, event_buffer 2^24; store_timeout
// and failed_ttl 24h, event_poll 1s): a value outside is an error naming
// the key, the value and the bounds.
//
// # Loads slower than prefill
//
// A store can be slower to load a prefix than the engine is to compute it
// (a disk tier under load, a remote store over a thin link). With
// "prefill_tokens_per_s" set to the engine's prefill speed, the scheduler
// half measures the tokens per second of its loads, from the step that
// plans each load to the one that reports it done (a moving average over
// the loads of late), and leaves out of a match the blocks whose load
// would run below the engine's rate: the engine recomputes them, which is
// faster. One match in 16 that would leave blocks out is let through all
// the same, so that the rate is measured again and the blocks count once
// loads are fast again. Stats.SlowSkipped counts the blocks left out of
// matches for that reason. It is off by default (0): the rate of prefill
// is the engine's to know, and a store that is fast enough gains nothing
// from the measure.
//
// Over a store in tiers that says which tier holds a key
// ([store.Layered], as store/tiered), the rate is measured and judged
// tier by tier: the lookup also asks which tier holds each block (the
// lowest tier holding a key of it), a load measures the rate of the
// lowest tier among its blocks, and a match ends at the first block of a
// tier whose loads run below the engine's rate; with groups, at the last
// point the request can resume from without such blocks. The blocks a
// fast RAM tier holds still count while those only on a slow disk do not.
// A tier not yet measured counts as fast. Over any other store the
// whole store is one tier. The tiers are those the lookup saw: a block
// promoted or evicted meanwhile loads from where it is then, and the
// load's rate is still counted for the tier the lookup named.
//
// # Tokens loaded by tier
//
// Over a [store.Layered] store a worker also counts the tokens of the
// blocks it loaded by the medium of the tier that served them, in
// Stats.LoadTokensCPU, LoadTokensDisk, LoadTokensStorage and
// LoadTokensOther (any other medium): what each tier actually
// delivered, where Stats.HitTokens of the scheduler half counts the tokens
// its matches promised. A block stored in layer chunks counts in the
// lowest tier that served one of its chunks. Each tensor-parallel worker
// counts the blocks it loaded (its own shard of each).
//
// # When the store fails
//
// Inference never waits on a failing store: a lookup that fails or runs
// past store_timeout is a miss, a load that fails is a failed block, a save
// that fails is dropped. Each such call is counted (Stats.StoreErrors,
// Stats.StoreTimeouts), logged at warn level at most once a second with the
// operation and the error, and shown by Health (both halves implement
// [connector.HealthReporter]): the consecutive failures and the last error.
// An asynchronous lookup stuck in a store call that ignores its deadline
// answers a miss once store_timeout has passed, and while one is stuck new
// lookups answer a miss at once; Close of either half then returns after
// the timeout with an error saying what still runs. A synchronous lookup
// ("lookup": "sync") runs inside Match and relies on the store honouring
// its deadline, as memstore does.
//
// Blocks whose load failed although the lookup found them (a client that
// died while the master still lists its keys) are not planned for loading
// again for failed_ttl; Stats.FailedSkipped counts the blocks left out of
// matches for that reason.
//
// The store comes from Env.Store; the connector never closes it.
//
// # Concurrency
//
// As package connector says: each half is used from one goroutine; the
// halves own their goroutines and join them in Close.
package storeconn
