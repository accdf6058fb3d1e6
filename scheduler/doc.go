// Package scheduler is the engine side of the connector contract, for Go
// inference engines: a paged KV block pool with a local prefix cache, the
// lifecycle of every request, and a reference step planner, which together
// call a [connector.Planner] in the order its contract asks and act on
// everything it reports. An engine that adopts it gets right, once, the
// rules that are easy to get wrong on the engine side: blocks that a
// connector keeps for a running save are not reused until it releases them;
// a request without external KV gets exactly the blocks it computes into;
// no lookup runs when prefix caching is off (unless configured); a weight
// update drops the local prefix cache as well as the external one.
//
// The package is engine-agnostic: it knows tokens, blocks and steps, not
// models. It does no I/O, starts no goroutine and is deterministic: the same
// calls, with the same connector answers, give the same plans.
//
// # Usage
//
// Make a scheduler over the engine's KV blocks, with the connector's
// scheduler half or nil, and drive it from the engine's loop:
//
//	s, err := scheduler.New(scheduler.Config{
//		Identity:         id, // the connector's identity; Layout.BlockSize is the block size
//		Blocks:           numBlocks,
//		MaxBatchedTokens: 8192,
//		PrefixCaching:    true,
//	}, conn) // conn may be nil
//
//	err = s.Add(scheduler.Request{ID: "r1", Prompt: tokens, Extras: extras})
//
//	for {
//		plan, err := s.Step()
//		ship(plan.Metadata)        // to every worker: w.Start(ctx, plan.Metadata)
//		for _, it := range plan.Items {
//			compute(it.Tokens[it.Start:it.End], it.Blocks) // hybrid: it.Tables, it.State
//		}
//		outs := poll()             // every worker: w.Save(ctx, ready); w.Poll()
//		err = s.Done(results, outs) // one Result per item with Sample
//		for _, e := range s.TakeEnded(nil) { respond(e) }
//	}
//
// After an online weight update, between Done and the next Step:
//
//	err = s.Invalidate(newGeneration)
//
// With nothing to compute ([Scheduler.Idle]) the engine may block until a
// connector half has news, rather than step:
//
//	err = s.Wait(ctx, wakes...) // every worker's Wake channel, and the engine's arrivals
//
// Before it stops, the engine drains: Drain runs the loop's body (a
// [StepFunc]) until every request has ended and every save was reported,
// so that closing the workers loses nothing; past ctx's deadline its
// *[DrainError] names what was not saved:
//
//	err = s.Drain(ctx, step, wakes...)
//	// then close the workers and the connector
//
// # Lost workers
//
// A worker rank whose Outputs stop coming while it owes transfers holds
// their blocks for ever; after Config.RankSteps steps of its silence
// (DefaultRankSteps) Done writes its transfers off and returns a
// *[RankLostError] naming it. An engine that learns of a lost worker
// sooner (its process died) calls [Scheduler.WorkersLost] with the Output
// a [connector.Ledger] writes for it.
//
// # Lifecycle
//
// Add queues a request; its full blocks are hashed with a [hashing.Chain]
// made with its extras, and every generated token extends the chain. Each
// Step first schedules the running requests, decodes before prefill
// chunks, within MaxBatchedTokens; when blocks run out it preempts the
// newest running request not yet scheduled in the step (never an older
// one), unless blocks the connector keeps will soon cover the need. Then,
// unless a running request is still short of blocks, it admits waiting
// requests in arrival order: the local prefix cache is
// looked up first, the connector is asked only for tokens beyond that hit
// ([connector.Planner.Match]; a Pending answer skips the request for this
// step without holding up the others), and the request gets the blocks of
// its hit plus exactly the blocks that its external KV, or else its first
// chunk, needs. A request with external KV is parked (Loading) until the
// connector reports its load; a failed load rolls it back to the last valid
// block and recomputes the rest, or fails it under the fail policy.
//
// When a request ends or is preempted, the connector's Finish says whether
// transfers still touch its blocks; if so the blocks are held until a
// Progress releases them, and a preempted request waits again only then.
//
// # KV cache groups
//
// A hybrid model's identity lists its KV cache groups
// (hashing.Layout.Groups): full attention, sliding window, recurrent
// state. The scheduler then keeps one block pool per group (each group's
// memory has its own blocks, as connector.KVCache.Groups describes it; a
// sliding-window or state group needs far fewer than full attention, so
// Config.GroupBlocks sizes each pool) and one block table per group per
// request, hands them to the connector in the layout's order, and gives
// each [Item] all of them in Tables. Every group's BlockSize must be
// Layout.BlockSize. Entry i of a table is block i of its group or
// connector.NoBlock:
//
//   - full attention: every block the request reached.
//   - sliding window of W tokens: the blocks holding tokens c-W+1 on,
//     where c is the next position to compute (a token attends to itself
//     and the W-1 before it); a block that falls out of that window leaves
//     the table once the step that moved past it is done: its entry
//     becomes NoBlock and the block goes back to the pool, cached if its
//     content is indexed. With a connector, a block that falls out of the
//     window within the step that computes it is hidden from Scheduled
//     (the connector never saves it) and freed at once, unless it is in
//     the window before the last boundary before the request's last token,
//     where a prefix cache resumes the same prompt. One the connector was
//     shown may be read by a save: the request holds it, out of its table,
//     until every worker's Output (passed to [Scheduler.Done]) reported
//     Done each transfer of the Metadata that names it, and frees it in
//     the next step that schedules the request, whose Scheduled call
//     passes NoBlock for it. A long decode thus holds about the window's
//     blocks; without Outputs (a connector whose workers report nothing)
//     the blocks wait for the connector to release the request.
//   - state: entry i holds the state after blocks 0..i where it is kept,
//     NoBlock elsewhere. The entry of the block the request is in holds
//     its running state, which decodes update in place.
//
// The policy for states is vLLM's mamba "align" mode: with a state group,
// a prefill chunk that does not reach the request's last token ends at a
// block boundary (MaxBatchedTokens must be at least a block), and the
// state is kept at the end of every chunk that ends at a boundary, at
// every boundary decoding reaches, and, in the chunk that reaches the last
// prompt token, also at the last boundary before that token: kept states
// stay in the table until the request ends. The reasons: a prefix cache
// can only resume where a state was kept, and an engine's recurrent kernel
// has the state at the end of a chunk for free, and one more inside it at
// the cost of one copy ([StateEntries].Snapshot), not at every boundary;
// the last boundary before the last prompt token is where the same prompt
// resumes (a match never covers the last token), those of the output are
// where the next turn of a conversation resumes; and aligned chunks
// never leave a state inside a block that a later chunk would have to
// move past, so no kept entry ever holds a state other than the one at
// its block's end. A state pool holds about one state per prefill chunk
// and per block of output of each running request.
//
// The local prefix cache follows the connector's resumability rules: a
// local hit is the longest block boundary every group can resume from
// with blocks the pools index (every full-attention block before it, the
// blocks of each sliding window before it, the state after its last
// block), and only those blocks are taken. A failed load of a hybrid
// request rolls back to the longest boundary its tables can resume from,
// its local hit's at least, and drops the state entries after it.
//
// Config.Validate refuses a pool too small to serve one step: a
// sliding-window pool needs twice the window's blocks and a step's, a
// state pool three states. A request that outgrows a pool (a long one's
// kept states, or the window blocks it holds for the connector) fails
// with [ErrTooLarge], as one longer than the full-attention pool does.
//
// # Concurrency
//
// A Scheduler, and a [Pool], is used from one goroutine; neither is safe
// for concurrent use.
package scheduler
