// Package mooncake is a [store.Store] backed by Mooncake Store, the
// distributed KV-cache store of the Mooncake project, through the C API
// of libmooncake_store.so (mooncake-store/include/store_c.h), loaded at
// run time with purego: no cgo, and no native library needed to build.
//
// It is for engines that share KV blocks across hosts. Each [Store] is one
// Mooncake client: it contributes Config.GlobalSegmentSize bytes of its
// memory to the cluster's pool, and puts and gets move values straight
// between the cluster and registered memory of the caller.
//
// # Usage
//
// Build Mooncake with -DWITH_STORE_C_SHARED=ON, start a mooncake_master,
// and point MOONCAKE_STORE_LIBRARY at the library (or put it on the loader
// path). The configuration is the JSON file that MOONCAKE_CONFIG_PATH names
// for vLLM and LMDeploy:
//
//	cfg, err := mooncake.ConfigFromEnv() // or mooncake.LoadConfig(path)
//	if err != nil { ... }
//	s, err := mooncake.Open(ctx, cfg)
//	if errors.Is(err, store.ErrUnavailable) { ... } // no library, or no master
//	defer s.Close()
//
//	kv, _ := rdma.AllocHost(blocks * blockSize) // KV memory, outside the Go heap
//	if err := s.Register(kv.Region()); err != nil { ... }
//	err = s.Put(ctx, keys, regions, res) // regions inside kv, one per key
//
// Open fails with an error wrapping store.ErrUnavailable when the library
// or one of the runtime libraries it needs is missing (naming it), and
// when setup fails (an [Error] with Op "setup"). Setup against a master
// that does not answer takes about 90 s and cannot be interrupted: Open
// returns when ctx ends, and the client is destroyed when setup ends.
//
// # Memory
//
// Mooncake reads and writes values in place: a put's source and a get's
// destination must lie inside a region given to [Store.Register] (the C
// API's register_buffer). The binding checks this in Go, with every key,
// region and length, before any native call: a key that [store.ValidateKey]
// refuses fails with store.ErrInvalidKey, a region that is empty or not
// inside a registered one with store.ErrInvalidRegion, and neither reaches
// the library. Register checks that host memory is mapped; device memory
// is refused unless Config.DeviceMemory says the library can reach it.
// Keys, pointer arrays and results are laid out in memory mapped outside
// the Go heap, from a pool of arenas, for the duration of each call.
//
// # Calls
//
// Each batch is one native call for all of its valid keys
// (batch_is_exist, batch_put_from, batch_get_into), and names each key
// once: a key repeated within a put is sent once (first writer wins), and
// one repeated within a get is read once, into its longest destination,
// and copied from there into the others, as Mooncake would otherwise fill
// only one destination and report success for all (repeats in device
// memory are read again, one more call per repeat). Finding repeats costs
// about 15 ns per key. As the C API reports presence and not size, Exists
// asks the size of each key found with one get_size call each, unless
// Config.PresenceOnly is set (then Result.N is 0 and the batch is one
// call). Per-key codes become [Error] values that match the store
// sentinels (-704 store.ErrNotFound, -200 store.ErrNoSpace, -600 on a get
// store.ErrBufferTooSmall, ...; see [Error]). RemovePrefix removes
// through remove_by_regex with the prefix escaped and anchored; RemoveAll
// removes every key of the cluster. Puts use the master's default
// replication, or Config.ReplicaNum and Config.PreferredSegments.
//
// # Leases and removal
//
// Exists and Get leave a read lease on each key they find (the master's
// --default_kv_lease_ttl, 10 s by default); a leased key is not evicted.
// [Store.Leases] says so ([store.Leaser]), with the lease's TTL as
// Config.LeaseTTL declares it (the C API cannot ask the master) and
// Config.RemoveLeaseWait.
// Removals never use force: a forced removal frees the value's memory at
// once, a put may reuse it while a get in flight still copies out of it,
// and that get then returns another key's bytes as success. Without
// force the master leaves a key that is leased or being read.
// TestRealRemovalNeverTearsReads measures both against a real master (64
// keys of 64 KiB, three readers, one writer, one remover): with forced
// removals 7, 18 and 33 reads of about 16,400 returned bytes that were not
// their key's value; with the binding's removals none of about 17,900,
// while about 99% of the removals were refused for a lease. Remove then retries for up to Config.RemoveLeaseWait (1 s by
// default) and fails with an error matching store.ErrHasLease if the lease
// is still held; RemovePrefix and RemoveAll skip such keys, and as the
// master reports only how many keys it removed, their count is all they
// return. A key read continuously stays leased, so removal is for clean-up
// after the keys stopped being used: to withdraw blocks, rotate the key
// identity (see package store), then remove the old prefix once its leases
// have ended.
//
// With the fake library of the tests, the binding adds 35 to 115 ns per
// key to a batch of 256 keys over the same native call made directly (see
// BenchmarkOverhead: exists 35 to 45, put 70 to 115, get 65 to 95, of
// which the search for repeated keys is about 15; Exists with sizes adds
// about 0.5 us per key found);
// against a real cluster a batch costs round trips to the master and a
// transfer, which the binding does not change.
//
// # Key events
//
// Store does not implement [store.Watcher]. The master evicts keys of its
// own accord, and the C API tells a client nothing of them: the binding
// cannot see evictions, nor removals or expiries made by other clients. It
// could see its own removals through Remove (one key, known), but
// RemovePrefix and RemoveAll remove by regex and return only a count, so a
// feed of them would be incomplete; a partial feed would let routers trust
// an index that eviction made stale. A connector over Mooncake therefore
// publishes no BlockRemoved; routers must age its blocks out by their own
// means.
//
// # Blocks whose layers are not contiguous
//
// A value is one contiguous region: the C API has no scatter/gather per
// key. An engine whose KV memory is block-major (all layers of a block
// side by side) stores each block, or each block and KV-head shard, as one
// key of one region. An engine whose memory is layer-major (one tensor per
// layer, as vLLM and LMDeploy allocate it) has two choices:
//
//   - one key per block and layer (or per block and group of adjacent
//     layers), each value straight from its layer's tensor: no copy, but
//     L times the keys, and a block is usable only when all of its L keys
//     are present (check them all, as for tensor-parallel shards);
//   - a block-major staging buffer: copy a block's layers into one
//     registered region and store one key (a memory copy per block on the
//     host, or a device-to-host copy, which a GPU engine pays anyway over
//     tcp).
//
// BenchmarkLayers measures the first choice against one key per block for
// the same bytes, through this binding and the fake library: 32 blocks of
// 512 KiB split into 4, 32 or 80 layer keys took about 1.5 to 2 times as
// long to put and 1.0 to 1.4 times as long to get. Against a real master
// the per-key cost is larger (metadata per key on the master, a transfer
// task per key), so prefer block-major layouts, or group adjacent layers
// into as few keys as a block allows, and keep values large (hundreds of
// KiB or more).
//
// # Threads and signals
//
// mooncake_store_create blocks SIGINT, SIGTERM, SIGHUP and SIGUSR1 on its
// thread and starts a thread that waits for them, tears the client down
// and re-raises them; the threads setup starts inherit the mask. In a Go
// program that would turn a Ctrl-C into a hard exit. Open therefore runs
// create and setup on a goroutine locked to a fresh OS thread (never the
// main thread), unblocks those signals on it before setup, and lets the
// thread end afterwards. Close runs destroy likewise on a fresh thread: no
// goroutine stays parked on a thread for the client's life, and no thread
// whose mask native code changed returns to the Go scheduler. Every other
// call may run on any thread, and each blocks the OS thread it runs on for
// its duration.
//
// The client's handshake listener and TCP transport bind every interface,
// even with a 127.0.0.1 local_hostname: firewall the ports on shared hosts.
//
// # Concurrency
//
// A Store is safe for concurrent use. Batch calls run concurrently;
// Register, Unregister and Close wait for the calls in flight. Close is
// idempotent; calls after it fail with store.ErrClosed. The library stays
// loaded until the process exits.
//
// # Tests
//
// The package's tests build a fake libmooncake_store.so with gcc from
// testdata/fake_store.c (an in-memory implementation of the C API with
// Mooncake's semantics and codes) and run store/storetest against the
// binding over it; without gcc they skip, unless MOONCAKE_FAKE_REQUIRE=1.
// Nothing outside the tests loads the fake. With MOONCAKE_STORE_LIBRARY
// and MOONCAKE_MASTER set, TestConformanceReal runs the same harness
// against a real cluster, and TestRealRemovalNeverTearsReads measures
// reads during removals there.
package mooncake
