// Package memstore is the embedded, in-process [store.Store]: the default
// store of kvconnect, with no native library and no service to run.
//
// It is for engines that share KV blocks between the workers of one
// process, for single-machine deployments, and for the tests of everything
// above the store (wrap it in
// [github.com/kvconnect/kvconnect/store/storetest.Faulty] to add faults).
//
// Values live in one arena of host memory mapped outside the Go heap when
// the store is created ([Config.Capacity] bytes). A put copies the value
// straight from the caller's region into the arena, a get straight from the
// arena into the caller's region: one copy each way, no intermediate
// buffer, and no Go-heap allocation per key in steady state. The arena is
// managed by a segregated-fit allocator with immediate coalescing, in
// 64-byte units: values of one size (the usual case for KV blocks) reuse
// each other's space exactly, and mixed sizes fragment little.
//
// # Usage
//
//	s, err := memstore.New(memstore.Config{Capacity: 8 << 30})
//	if err != nil { ... }
//	defer s.Close()
//
//	res := make([]store.Result, len(keys))
//	err = s.Put(ctx, keys, srcs, res) // srcs: host regions, e.g. from rdma.AllocHost
//	err = s.Get(ctx, keys, dsts, res)
//
// Register and Unregister only record regions; Put and Get accept any
// valid host region (non-zero address, positive length, in host memory)
// unless [Config.RequireRegistered] is set, which makes them refuse memory
// outside the registered regions with store.ErrInvalidRegion, as Mooncake
// Store does: tests that must catch a missing registration use it. Device
// regions are refused with store.ErrInvalidRegion.
//
// memstore implements [store.Vectored]: PutV gathers a value from several
// regions and GetV scatters it into several, each region copied straight
// to or from the arena with no staging buffer, so that a block and a
// trailer kept apart in memory travel as one value (a GetV of a value in
// two or eight regions ran at 0.99 to 1.06 times the time of a Get of the
// same bytes into one region: BenchmarkGetV).
//
// Keys are copied when an entry is made, so an entry never keeps alive
// the string a caller cut a batch's keys from.
//
// # Eviction
//
// memstore is a cache. When a put would take the memory in use above
// [Config.HighWatermark] of the capacity, it first evicts least recently
// used entries, [Config.EvictRatio] of the capacity (or more, if the value
// needs it), like Mooncake's eviction_high_watermark_ratio and
// eviction_ratio. If there is still no room (every entry is being read, or
// the free memory is too fragmented) the key gets store.ErrNoSpace and is
// counted in Stats.RejectedPuts; the caller may retry later. A put and a
// get count as uses; Exists does not. LRU order is exact within a shard and
// approximate across shards: one store-wide clock stamps every use, and an
// eviction repeatedly takes from the shard whose oldest entry is oldest.
//
// # Leases and removal
//
// memstore grants no leases. An entry is pinned only while a Get copies its
// bytes out: it cannot be evicted during the copy, and a Remove,
// RemovePrefix or RemoveAll during the copy takes the key away at once but
// frees its memory only when the copy ends, so no put can reuse it under the
// read. A Get that overlaps a removal of its key therefore copies the value
// whole or finds the key absent, as [store.Store] requires, and a removal
// never fails or leaves a key because of a read. Exists pins nothing, so
// probing many keys never holds memory: a key reported present may be
// evicted before the Get that follows, which then returns store.ErrNotFound
// and counts as a miss. Mooncake instead grants a read lease (10 s by
// default) on exists and get; leased entries cannot be evicted, and
// exists-heavy lookups have been seen to starve eviction that way. memstore
// therefore never returns store.ErrLeaseExpired or store.ErrHasLease, and
// says so through [store.Leaser]: [Store.Leases] returns the zero
// store.Leases.
//
// # Watching
//
// memstore implements [store.Watcher]: [Store.Watch] opens a bounded feed
// of the keys that reach the store (store.KeyStored, a new key's put), that
// its evictions drop (store.KeyEvicted) and that Remove, RemovePrefix or
// RemoveAll delete (store.KeyRemoved). Each is announced under the lock of
// the key's shard, so one key's events come in the order they happened.
// With no feed open an announcement costs one atomic load; with feeds open,
// a lock per feed. A full feed drops and counts and never holds a put up:
// its reader learns how many it lost from [store.Feed.Take]. KV-aware
// routers depend on it: connector/storeconn turns it into BlockRemoved
// events.
//
// # Concurrency
//
// A Store is safe for concurrent use. The key index is split into
// [Config.Shards] shards, each with its own lock, chosen by a hash of the
// key; the allocator has one lock, held only to take or return memory.
// Copies run with no lock held. A batch Exists locks up to eight shards at
// a time, in ascending order. Close waits for the calls in flight, then
// unmaps the arena; later calls return store.ErrClosed.
//
// # Memory
//
// The values live in the arena, outside the Go heap. The key index holds
// one Go pointer per 64 KiB of keys, so the garbage collector has almost
// nothing to scan in it: per key, one 40-byte entry, one 8-byte slot of an
// open-addressing table kept at most 3/4 full, 40 bytes of the arena's
// allocator, and a record in a heap of 64 KiB chunks per shard: the
// entry's index, the value's size and the key's length in 12 bytes, then
// the key's own bytes. A slot points at its record, so a lookup reads two
// places, not three. With 6 million 108-byte keys that is 116 bytes per
// key besides the key (224 with it; BenchmarkIndexScale).
package memstore
