// Package store defines the interface between kvconnect and the stores that
// hold KV-cache blocks: [Store], its per-key [Result], its [Stats], and the
// sentinel errors every implementation returns.
//
// It is for two kinds of reader. Connectors and engines code against
// [Store] and match errors with errors.Is. Implementers (the embedded
// store/memstore, the Mooncake binding store/mooncake, or a third party's)
// implement it and prove it with the conformance harness in
// store/storetest, which also offers a fault-injecting wrapper for the
// tests of higher layers.
//
// # Usage
//
// Values move between the store and memory regions of the caller
// ([rdma.Region]), never through Go-heap buffers: register the memory the
// blocks live in once, then put and get batches of whole blocks.
//
//	if err := s.Register(kv.Region()); err != nil { ... }
//	defer s.Unregister(kv.Region())
//
//	res := make([]store.Result, len(keys))
//	if err := s.Exists(ctx, keys, res); err != nil { ... } // the call failed
//	for i := range res {
//		if res[i].Err != nil { break } // the longest present prefix ends here
//	}
//	err := s.Get(ctx, keys[:n], dsts[:n], res[:n])  // one region per key
//	err = s.Put(ctx, keys, srcs, res)               // first writer wins
//
// Each res[i].N is a number of bytes: the value's size for Exists and Get
// (for Get, the bytes written), the source's length for Put, duplicates
// included; 0 on error (see [Result]).
//
// A batch call returns an error only when the call as a whole failed: the
// store is closed, ctx was done before anything was done, or the slices
// disagree in length ([CheckBatch]). Everything else is reported per key in
// res[i].Err, and the other keys of the batch are unaffected. Callers treat
// every per-key error of a get as a miss, and every per-key error of a put
// as "not stored"; the store is a cache, and a key present in one call may
// be gone in the next.
//
// # Errors
//
// Per-key and whole-call errors match one of the sentinels below with
// errors.Is; most are wrapped with the key, the sizes or the region at
// fault. Each corresponds to a Mooncake Store code, so a binding maps codes
// one to one:
//
//	error               Mooncake code                   meaning
//	ErrNotFound         -704 OBJECT_NOT_FOUND           key absent: never stored, removed or evicted
//	ErrNoSpace          -200 NO_AVAILABLE_HANDLE        put refused for lack of space; nothing stored, retry later
//	ErrLeaseExpired     -707 LEASE_EXPIRED              get after the read lease granted by exists ran out
//	ErrHasLease         -706 OBJECT_HAS_LEASE           remove of a key under a read lease
//	ErrBufferTooSmall   -600 INVALID_PARAMS (get)       destination shorter than the value; nothing written
//	ErrInvalidKey       -600 INVALID_PARAMS (key)       key fails [ValidateKey]
//	ErrInvalidRegion    -600 INVALID_PARAMS (buffer)    empty, unregistered or unsupported region
//	ErrTransfer         -800 TRANSFER_FAIL, -900, -901  the bytes did not move (transfer, RPC failure or timeout)
//	ErrClosed           (none)                          the store was closed
//	ErrUnavailable      (none; -1 at setup)             library or service missing
//
// Mooncake's -705 OBJECT_ALREADY_EXISTS is not an error here: a put of a
// present key succeeds and keeps the first value. Context errors
// (context.Canceled, context.DeadlineExceeded) are returned as they are.
//
// # Removal
//
// Removing keys is a physical clean-up, not the way to withdraw blocks.
// To make a tenant's or a generation's blocks unreachable, change the
// identity their keys are built from: keys are tenant/namespace/shard/hash
// (package hashing), and a rotated identity has a new namespace, so from
// then on no lookup names an old key, whatever the store still holds. The
// old keys are deleted later with RemovePrefix of the old namespace's
// prefix, and meanwhile age out like any cold entry.
//
// A removal never tears a read. A Get that overlaps a Remove,
// RemovePrefix or RemoveAll of its key copies the value whole or reports
// the key absent (or another per-key error); it never returns success with
// another key's bytes or a mix. Stores differ in how: memstore takes the
// key away at once and frees its memory when the last copy out of it ends;
// Mooncake grants a read lease on each key found by an exists or read by a
// get, and store/mooncake removes without overriding leases, so a key under
// a lease stays (Remove fails with ErrHasLease after a bounded wait,
// RemovePrefix and RemoveAll skip it) until the lease ends. A store says
// which of its calls grant leases, for how long, and how long Remove waits
// for one, through the optional interface [Leaser]:
//
//	if l, ok := s.(store.Leaser); ok && !l.Leases().Exists {
//		// probing keys with Exists holds nothing back from eviction or removal
//	}
//
// Callers that remove keys treat what is left as stale, never as
// withdrawn.
//
// # Concurrency
//
// Every Store is safe for concurrent use by multiple goroutines, and every
// batch call may run at the same time as any other, including calls on the
// same keys, and a key may be named more than once in one batch (see
// [Store.Put] and [Store.Get]). Close waits for calls already running and
// makes later ones return [ErrClosed]. Slices passed to a call are read (or, for results,
// written) only during the call. The bytes of a region must not be changed
// by the caller while a put reads them, nor read while a get writes them.
package store
