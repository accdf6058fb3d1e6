// Package mooncake is an [rdma.Engine] over Mooncake Transfer Engine
// (github.com/kvcache-ai/Mooncake, mooncake-transfer-engine), bound at run
// time with purego to a shared library that exports its C API
// (transfer_engine_c.h): no cgo, and nothing native is needed to build.
//
// It is for engines whose prefill and decode instances run in different
// processes or hosts: each instance opens an [Engine], registers its KV
// memory, and tells its peers its segment name ([Engine.Segment]) and the
// addresses of its blocks; a peer reads them straight into its own
// registered blocks over TCP or RDMA.
//
// # Usage
//
//	eng, err := mooncake.Open(ctx, mooncake.Config{Hostname: "10.0.0.11"})
//	if errors.Is(err, mooncake.ErrUnavailable) {
//		// no libtransfer_engine.so here: fall back (rdma.Loopback in one process)
//	}
//	defer eng.Close()
//	err = eng.Register(kv.Region())              // host memory from rdma.AllocHost
//	seg, err := eng.Open(ctx, peerSegment)       // "10.0.0.12:15873"
//	b, err := eng.NewBatch(n)
//	err = b.Submit(reqs)                         // one native call
//	err = b.Wait(ctx)
//	... b.Result(i) ...
//	err = b.Release()
//
// The library is found through Config.Library, else
// MOONCAKE_TRANSFER_ENGINE_LIBRARY (a file, or a folder holding
// libtransfer_engine.so), else libtransfer_engine.so on the loader path.
// Upstream Mooncake builds the engine as a static library; configure it
// with -DBUILD_SHARED_LIBS=ON to get libtransfer_engine.so (see the
// README). A missing library, a missing dependency of it, or an engine
// that fails to start is an error wrapping [ErrUnavailable].
//
// By default the engine uses P2PHANDSHAKE metadata (no metadata service:
// it listens on a port it picks, and its segment name is "host:port") and
// the tcp transport; Config selects rdma with its NICs, or a metadata
// service. MC_LOG_LEVEL=ERROR quiets Mooncake's log; each engine listens
// on two ports (15000-17000 unless MC_MIN_RPC_PORT / MC_MAX_RPC_PORT say
// otherwise) on every interface.
//
// # What the binding checks
//
// Mooncake's C API checks little: an opcode other than WRITE is taken as
// READ, the TCP transport does not check that local memory is registered,
// a batch id is a raw pointer (freeing it twice is a use after free), and
// its calls use two conventions for codes (positive Status codes from
// submit, status and free; negative ERR_* codes from the others). The
// binding checks every request before the native call (opcode, local
// registration, ranges, segment handle, batch capacity), frees each batch
// exactly once and only when Mooncake has finished every request in it,
// refuses to unregister memory that a request still uses, and maps both
// code conventions to [Error], which matches the rdma sentinels. A request
// Mooncake reports TIMEOUT is not final: its task is still in flight and
// may move its bytes yet, so it stays pending until Mooncake finishes it
// (see [Batch]). Requests
// are laid out in memory outside the Go heap as struct transfer_request
// (40 bytes, checked when Open runs); native code never receives Go-heap
// memory.
//
// # Concurrency
//
// An Engine and its batches are safe for concurrent use. Each native call
// blocks an OS thread while it runs; Wait polls, yielding and then
// sleeping between polls. Close waits for transfers in flight (up to
// Config.CloseTimeout) before destroying the native engine.
package mooncake
