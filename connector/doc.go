// Package connector defines the stable API between a Go inference engine and
// a KV connector: the two role interfaces, the plain values that pass
// between them, the kv_transfer_config format, and the registry of drivers.
//
// A connector has a scheduler half ([Planner]), driven by the engine's
// scheduling loop, and a worker half ([Worker]), one per worker (tensor
// parallel rank), which owns that worker's KV memory and moves its blocks.
// The halves talk through values the engine ships: [Metadata] from the
// scheduler to every worker each step, and [Output] from each worker back.
// Both have a versioned binary encoding, each frame checksummed, for
// engines whose workers are other processes ([Metadata.MarshalBinary]).
// This package holds no connector: the reference one, over any store, is
// in connector/storeconn; connector/connectortest is the conformance
// harness any connector can run.
//
// # Usage
//
// Open both halves by name with one Config, then drive them from the
// engine's loops:
//
//	cfg, err := connector.ParseConfig(kvTransferConfigJSON)
//	env := connector.Env{Identity: id, Store: st}
//	sched, err := connector.OpenPlanner(cfg, env)
//	env.Rank = rank
//	w, err := connector.OpenWorker(cfg, env)
//	err = w.Register(kv)
//
//	// each step, scheduler side
//	m, err := sched.Match(req, localHitTokens)   // Pending: ask next step
//	err = sched.Allocated(req, m.Tokens, blocks)
//	err = sched.Scheduled(req, computedAfterStep, blocks)
//	meta := sched.Plan()
//	// each step, worker side
//	err = w.Start(ctx, meta)
//	... compute ...
//	err = w.Save(ctx, connector.Ready)
//	out := w.Poll()
//	// back on the scheduler
//	progress, err := sched.Update([]*connector.Output{out})
//
// The package scheduler implements the engine side of this contract (block
// pool, request lifecycle, step planner) for engines that want it. Its
// scheduler.Scheduler is the engine's scheduler, which drives a
// connector.Planner (this package's interface, the connector's scheduler
// half); the two are never interchangeable.
//
// # Block tables
//
// The calls that name a request's blocks (Allocated, Scheduled, Finish,
// Preempt) take its block tables as their last, variadic, arguments: one
// table per KV cache group of the identity's layout (hashing.Layout.Groups),
// in the layout's order. A model with one group, a plain transformer,
// passes its one table: sched.Allocated(req, m.Tokens, blocks). A hybrid
// model passes one per group: sched.Allocated(req, m.Tokens, full, swa,
// state), or tables... from a [][]BlockID. The number of tables must equal
// the number of groups (driver.CheckTables); Finish and Preempt of a request
// that holds no blocks may pass none. A call that lists its tables makes Go
// build a slice of them, which escapes through the interface: one small
// allocation per call. An engine that counts allocations keeps a
// [][]BlockID per request and passes tables... (the scheduler package
// does). In every group, entry i of the table
// holds the group's block i, tokens [i*B, (i+1)*B) for the group's block
// size B, or [NoBlock]:
//
//   - full attention: every block before the point the request has reached.
//   - sliding window of W tokens: the blocks holding the last W tokens
//     before that point; older entries may be NoBlock (freed). The engine
//     frees such a block only once no unfinished transfer names it (every
//     worker's Output reported Done each transfer of the Metadata that
//     names it), and only in a step whose call about the request
//     (Scheduled, Finish or Preempt) passes NoBlock for it before the
//     next Plan (vLLM frees the blocks of the requests it schedules): a
//     connector plans no transfer of a block that the latest tables do
//     not hold, and a worker touches no block that no unfinished transfer
//     names.
//   - state (recurrent, Mamba, linear attention): entry i holds the state
//     after the tokens of blocks 0..i, where the engine kept it; NoBlock
//     where it did not. The engine decides which boundaries it keeps (every
//     one, or only the ends of its prefill chunks); a match can end only at
//     a boundary whose state some engine saved.
//
// A match is the longest prefix every group can resume from: all its blocks
// for full attention, the window before the match point for a sliding
// window, the state at the match point for a state group. A load fills, in
// the engine's tables, exactly the entries the match needs beyond the
// engine's own local hit, and nothing else.
//
// # Ownership
//
// Values cross the API in one direction at a time. What the engine passes
// in (a Request, block tables, Outputs) is read during the call and never
// retained. What a half hands out (the Metadata from Plan, the Progress
// from Update, the Output from Poll) is the half's, read-only, and valid
// until the next call of the same method. The connectors of this module
// keep their own records apart from what they hand out (driver.PlanBuffer hands
// out copies of a Metadata's blocks and hashes), so an engine that writes
// into one corrupts nothing of their state, but what it wrote is what the
// workers receive. Copy or encode a value to keep it longer.
//
// # Identity
//
// Every key a connector reads or writes is bound to Env.Identity (tenant,
// model, weights version and generation, KV format, shard layout) through
// its namespace; see package hashing. After an online weight update the
// engine calls Rotate (optional interface [Rotator]) and the workers follow
// through the Metadata's Generation.
//
// # Optional capabilities
//
// A half may implement [StatsReporter], [HealthReporter], [Rotator],
// [EventSource], [Preempter], [TransferParamsSource] or [Waker]; callers
// check with a type assertion once, after opening. Each has a documented
// fallback: no stats, no health, no rotation (reopen the connector with a
// new identity), no events, Finish, no parameters, stepping to poll.
//
// # Errors and misuse
//
// Bad input is an error that names the argument and its value, and
// changes nothing: a request with an empty ID or prompt, computed tokens
// past the prompt, negative or repeated block ids, a rotation to an older
// or the same generation ([ErrGeneration]), a Metadata whose step does not
// increase or that names a transfer twice ([ErrBadMetadata]), a call after
// Close ([ErrClosed]), an unknown kv_connector_extra_config key
// ([ErrConfig], with the nearest known key). A nil *Request, *Metadata or
// context is a programmer error and panics, as a nil context does in the
// standard library; a nil entry among the Outputs handed to Update comes
// from a worker, and is an error naming its index.
//
// # Concurrency
//
// A Planner is used from one goroutine. A Worker is used from one
// goroutine, and runs its transfers on goroutines it owns and joins in
// Close. Register, OpenPlanner and OpenWorker are safe for concurrent use.
//
// # For connector implementations
//
// An engine never calls these; a connector's halves do. Config.CheckExtra,
// Config.ExtraString, Config.ExtraChoice, Config.ExtraInt, Config.ExtraBool
// and Config.ExtraDuration read kv_connector_extra_config with errors that
// name the key; KVCache.Spans gives the byte spans of a block. Package
// connector/driver has the rest: Tally, PlanBuffer, CheckTables, Table.
package connector
