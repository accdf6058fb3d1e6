// Package rdma describes memory that native code reads and writes directly:
// the host memory of a process, mapped outside the Go heap, and the memory of
// accelerator devices.
//
// It is for stores, transfer engines and device runtimes that move KV-cache
// blocks without staging copies, and for engines that hand them their KV
// memory. A [Region] names a span of such memory (an address, a length and a
// [Location]); it is a plain value that owns nothing. [HostMemory], from
// [AllocHost], owns a span of host memory mapped with mmap: page aligned,
// never moved or traced by the garbage collector, and released only by an
// explicit [HostMemory.Free]. Go-heap memory must never be handed to native
// code; memory from AllocHost may be.
//
// # Usage
//
//	mem, err := rdma.AllocHost(64 << 20)
//	if err != nil {
//		return err // wraps rdma.ErrUnsupported where mmap is not available
//	}
//	defer mem.Free()
//
//	r := mem.Region()          // the whole mapping: rdma.Region{Addr, Len, Loc: rdma.Host}
//	blk, err := r.Sub(off, n)  // one KV block inside it
//	...
//	n, err := rdma.Copy(dst, blk) // host-to-host memmove between regions
//
// [HostMemory.Bytes] returns a []byte view of the mapping for Go code that
// fills or checks it; [Region.Bytes] does the same for any host region.
// Neither slice may be used after the memory is freed.
//
// # Transfer engines
//
// An [Engine] moves bytes between memory registered with it and the
// memory its peers registered with theirs, in batches of [Request]s, with
// a [Result] per request ([Completed], [Failed], [Timeout], [Canceled]).
// [Loopback] engines are peers through a [Fabric] in one process (every
// test uses them); package rdma/shm moves bytes between processes of one
// host through shared memory, and package rdma/mooncake binds Mooncake
// Transfer Engine across processes and hosts. Package rdma/rdmatest
// checks an engine against the promises of Engine and Batch, and
// [BatchState] keeps a Batch's results for an engine that completes its
// requests itself (Loopback and rdma/shm do).
//
//	f := rdma.NewFabric()
//	prod, _ := f.NewEngine("prefill", nil)
//	cons, _ := f.NewEngine("decode", nil)
//	...register memory on both...
//	seg, _ := cons.Open(ctx, prod.Segment())
//	b, _ := cons.NewBatch(n)
//	err = b.Submit(reqs) // local mistakes: an error, nothing submitted
//	err = b.Wait(ctx)    // remote mistakes: Failed results, nothing touched
//	r := b.Result(0)
//	err = b.Release()
//
// A final status is also a promise about memory: once a request is final
// (Wait returned nil, or Release did) nothing touches its memory any
// more, so a block whose read failed may be recomputed or reused at once.
// A transport that reports a timeout while it may still move bytes (as
// Mooncake does) leaves the request [Pending] until it is done. A batch
// that is not final is never dropped: a caller that gives up waiting
// (Wait's context ended, or Submit failed after queuing requests, which
// Len tells) must keep the requests' memory out of use until a later Wait
// returns nil.
//
// [RegionSet] is the bookkeeping of registered memory engines share.
//
// # Platforms
//
// AllocHost maps anonymous memory with syscall.Mmap on Unix systems (Linux,
// macOS, the BSDs, ...). Elsewhere it returns an error wrapping
// [ErrUnsupported], which also matches errors.ErrUnsupported. On Linux a
// map of 2 MiB or more is advised for transparent huge pages
// (MADV_HUGEPAGE), which the kernel honours where they are enabled
// ("madvise" or "always"): the first write of a fresh 40 MiB region took
// 0.13x the time of small pages here (BenchmarkAllocHostTouch).
//
// # Concurrency
//
// Region is a value and safe to share. A HostMemory is safe for concurrent
// use: Free may be called from several goroutines, and any number of times;
// the first call unmaps. The bytes themselves are not synchronised by this
// package: callers that read and write the same bytes from several goroutines
// (or from native code) order those accesses themselves, and must not free a
// mapping while anything still uses it. Engines and batches are safe for
// concurrent use; a Loopback owns a few goroutines (LoopbackOptions.Workers)
// and joins them in Close.
package rdma
