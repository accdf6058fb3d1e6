// Package kvconnect is a Go SDK for sharing LLM KV-cache blocks between
// inference engines through an external store.
//
// Inference engines recompute the same prompt prefixes again and again:
// system prompts, retrieved context, multi-turn history. With kvconnect, an
// engine saves every full KV block it computes to a shared store under a
// content-addressed key, and loads it back instead of recomputing it: across
// instances, after local eviction, and on a cold start. Every key binds the
// stored bytes to the tenant, the model, its weights version and generation,
// the KV format and the shard layout, so no engine is ever served stale or
// foreign KV. Whom these guarantees hold against: SECURITY.md at the root.
//
// This root package holds no code; the SDK lives in its sub-packages:
//
//   - [github.com/kvconnect/kvconnect/hashing]: the block-hash chain over
//     token ids, per-request extra keys, the namespace identity and the
//     store keys built from them.
//   - [github.com/kvconnect/kvconnect/rdma]: registered memory regions that
//     stores and transfer engines read and write without staging copies.
//   - [github.com/kvconnect/kvconnect/store]: the Store interface; the
//     embedded in-process store is store/memstore, and store/storetest is
//     a conformance harness any implementation can run.
//
// # Roles
//
// An engine has one scheduler, which decides what runs each step, and one or
// more workers, which own KV memory and run the model (one per tensor-parallel
// rank). A connector has one half for each role. The scheduler half answers
// how many further prompt tokens the store holds for a request and plans
// each step's loads and saves; the worker half moves block bytes between the
// engine's KV memory and the store. The two halves talk only through plain
// values that the engine ships from its scheduler to its workers and back.
//
// # Integration
//
// An engine hashes each request's full blocks with a hashing.Chain, asks
// the scheduler half for external hits beyond its local prefix cache,
// allocates blocks for them, and ships each step's plan to its workers,
// which start the loads, run the step, and save the blocks the step
// completed once its compute is done.
package kvconnect
