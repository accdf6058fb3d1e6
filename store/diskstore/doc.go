// Package diskstore is a persistent [store.Store] on a local directory:
// the disk tier of a store in tiers (see store/tiered), or a store of its
// own for one engine that wants its KV cache to survive a restart.
//
// Values live in large append-only segment files (not a file per block),
// each value a record with a header that names its key, its length and a
// CRC-32C checksum of the value, so that a record describes itself. A
// value is visible only once its record is written whole. The store is
// bounded by Config.Capacity bytes of files: when a new segment would go
// past it, the oldest segment is deleted with every value in it (a cache
// may drop; Stats.Evictions counts them). The deleted file's last close,
// which frees its pages in the page cache and its blocks on disk (tens of
// milliseconds for a large segment), runs on a goroutine of its own, not
// in the call that evicted it or read from it last. A write (of a put or
// a removal) that finds the disk full while such closes run, or ran since
// it began, waits for them and writes once more; Close waits for them
// too. Removals append tombstones, so that what was removed stays removed
// after a restart.
//
// Open rebuilds the index by reading the records' headers, so a restarted
// process finds every value its predecessor stored whole: the index holds
// 16 bytes per key plus the map's overhead, and no key (a Get compares the
// key stored in the record with the one asked for); each segment lists
// the 8-byte index keys of its values, so that its eviction drops those
// without a pass over the whole index. Open reads the segments' headers
// in parallel, GOMAXPROCS segments at a time. A record torn by a
// crash or kill -9, or damaged on disk, is never served: Open skips
// headers that do not parse (a stretch it skips is counted in
// [Store.IO]), and every Get checks the header and the value's checksum
// before it reports success; a record that fails is dropped, counted and
// reported as store.ErrNotFound naming the file and offset. The checksum
// costs a pass over the value at CRC-32C speed; Config.TrustValues skips
// it for a caller that verifies what it loads (storeconn's "verify":
// "checksum", the default, does).
//
// Writes are batched: a Put of many keys is one vectored write (pwritev)
// per segment, from the caller's memory through the page cache. Reads go
// straight into the caller's memory (preadv): with O_DIRECT when the file
// system supports it, the value is whole pages (such as a KV block), the
// destination is one page-aligned region (memory from rdma.AllocHost
// is), and the page cache does not hold the whole value already (on
// Linux 6.5 and later, which tell), and through the page cache otherwise;
// [Store.IO] counts which.
// Values are not synced to disk: what a process wrote survives its own
// crash (the page cache holds it), and after a power loss any value the
// checksums do not vouch for is dropped.
//
// One process at a time opens a directory: Open takes a lock file
// (Dir/LOCK) and fails naming the process that holds it.
//
// diskstore needs Linux; elsewhere Open returns an error wrapping
// errors.ErrUnsupported.
//
// # Usage
//
//	s, err := diskstore.Open(diskstore.Config{Dir: "/var/cache/kv", Capacity: 512 << 30})
//	if err != nil {
//		return err
//	}
//	defer s.Close()
//	// use s as any store.Store: directly, or as a tier of store/tiered.
//
// # Concurrency
//
// A Store is safe for concurrent use. Calls run in parallel; puts reserve
// their space under a short lock and write outside it. A Get that runs
// while its key is removed or its segment evicted reads the value whole
// (the file stays open until the read ends) or reports store.ErrNotFound.
// It implements [store.Vectored], [store.Leaser] (no leases) and
// [store.Watcher] (stored, evicted and removed keys; evicted keys are read
// back from the segment, so a feed costs a read of their headers).
package diskstore
