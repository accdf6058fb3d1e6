// Package scheduler is the engine side of the connector contract, for Go
// inference engines: a paged KV block pool with a local prefix cache, the
// lifecycle of every request, and a reference step planner, which together
// call a [connector.Scheduler] in the order its contract asks and act on
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
//			compute(it.Tokens[it.Start:it.End], it.Blocks)
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
// ([connector.Scheduler.Match]; a Pending answer skips the request for this
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
// # Concurrency
//
// A Scheduler, and a [Pool], is used from one goroutine; neither is safe
// for concurrent use.
package scheduler
