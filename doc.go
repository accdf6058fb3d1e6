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
// This root package holds no code; the SDK lives in its sub-packages.
//
// # Where to start
//
// An engine (a Go inference engine that saves and loads KV) starts with:
//
//   - [github.com/kvconnect/kvconnect/scheduler]: the engine's scheduler:
//     block pool with a local prefix cache, request lifecycle, step
//     planner, and the drain at shutdown. It drives a connector.
//   - [github.com/kvconnect/kvconnect/connector]: the contract between an
//     engine and a connector (its scheduler half and its workers), the
//     registry that opens a connector by name from a kv_transfer_config,
//     and the wire format of the values between the halves.
//   - [github.com/kvconnect/kvconnect/connector/storeconn]: the reference
//     connector, over any store.
//   - [github.com/kvconnect/kvconnect/store/memstore]: the embedded store;
//     store/mooncake is Mooncake Store, store/remote serves a store to
//     other processes, store/diskstore keeps blocks on a local disk across
//     restarts, and store/tiered stacks stores (RAM over disk over remote).
//
// docs/engine.md in the repository has the complete loop: every rank's
// worker, requests, compute, and the drain.
//
// A store author implements [github.com/kvconnect/kvconnect/store].Store
// and runs store/storetest's conformance harness. A connector author
// implements connector.Planner and connector.Worker, registers a
// connector.Driver, and runs connector/connectortest; connector/driver has
// the helpers only connector implementations need. A transfer engine
// author implements [github.com/kvconnect/kvconnect/rdma].Engine and runs
// rdma/rdmatest.
//
// The other packages: [github.com/kvconnect/kvconnect/hashing] (the
// block-hash chain, the namespace identity and the keys, with a byte-level
// spec), [github.com/kvconnect/kvconnect/rdma] (registered memory and
// transfer engines: loopback, rdma/shm, rdma/mooncake), connector/p2p
// (disaggregated prefill and decode), [github.com/kvconnect/kvconnect/cudart]
// and connector/cudacopy (KV in GPU memory), connector/prom (Prometheus
// metrics) and connector/kvevents (KV events for routers).
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
// A connector's scheduler half is a connector.Planner (storeconn.Planner
// and p2p.Planner are two): it plans each step's loads and saves. The
// engine's scheduler, which drives one, is scheduler.Scheduler.
//
// # Integration
//
// An engine hashes each request's full blocks with a hashing.Chain, asks
// the scheduler half for external hits beyond its local prefix cache,
// allocates blocks for them, and ships each step's plan to its workers,
// which start the loads, run the step, and save the blocks the step
// completed once its compute is done.
package kvconnect
