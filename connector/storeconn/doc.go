// Package storeconn is the reference connector: it shares KV blocks through
// any [store.Store], the embedded memstore or Mooncake Store alike. Import
// it for its side effect of registering the driver under [Name]
// ("StoreConnector"), or open its halves directly.
//
// # What it does
//
// Lookup: Match probes the store once per request (one batch exists over
// every block beyond the engine's local hit and every KV shard), on a
// bounded pool of goroutines, and answers Pending until the probe is done.
// The answer is the longest run of blocks present in every shard, never the
// last prompt token, so every rank of a tensor-parallel group sees the same
// hit. The result is kept per request: a pending answer is not asked twice.
//
// Loads go straight from the store into the engine's blocks (block-major
// memory) or through a registered staging buffer (layer-major memory).
// Saves wait for the step's ready event, copy only full blocks, skip blocks
// that the store is known to hold or that another request is saving, and
// are striped across KV-head replicas so each block is written by exactly
// one rank. A put that finds no space stops that request's saves for the
// step; the blocks are planned again in a later step, up to save_retries
// times, and every failure is counted.
//
// A block that fails to load is reported as a failed block, through
// Progress.Failed, no later than the step in which the request's loads are
// reported done, with the policy (recompute or fail) applied.
//
// Rotate moves every key to a new weights generation: from the next step
// on nothing of an older generation is looked up, loaded or saved; saves of
// an older generation still queued in a worker are dropped (ReasonStale),
// never written under the new one.
//
// # Configuration
//
// kv_connector_extra_config keys: "lookup" ("async", the default, or "sync"
// to probe inside Match: fine for the embedded store), "lookup_workers" (2),
// "lookup_queue" (256), "transfer_workers" (2), "batch_blocks" (64 blocks
// per store call), "save_retries" (3), "retry_steps" (1), "event_poll"
// ("50us", the first interval at which a ready event is polled).
//
// The store comes from Env.Store; the connector never closes it.
//
// # Concurrency
//
// As package connector says: each half is used from one goroutine; the
// halves own their goroutines and join them in Close.
package storeconn
