// Package rdmatest checks implementations of [rdma.Engine].
//
// It is for the tests of transfer engines: an engine's own tests call
// [Run], a conformance harness in the spirit of testing/fstest and
// golang.org/x/net/nettest, with a function that opens two engines that
// reach each other's segments. Run checks the promises that [rdma.Engine]
// and [rdma.Batch] document: the bytes each request moves, byte for byte
// and nowhere else; local-side errors that submit nothing; remote-side
// failures that move nothing; batch capacity, zero-length requests and
// release; concurrent batches; closed engines and peers; and that a final
// request is settled (nothing moves its bytes any more once Wait returned,
// whatever Release, Unregister and Close do next). Memory next to every
// registered region is a guard that no request may touch.
//
// It exercises only what the engines declare in [Options]: a second pair
// whose transfers outlive their transport's delivery timeout (Late), and
// the allocator of the memory they can register, for engines that take
// only memory of their own (Alloc; rdma/shm's shared memory).
//
// # Promises and the checks that prove them
//
// Every promise of [rdma.Engine] and [rdma.Batch], and the subtest that
// checks it. Transfers run at real sizes: regions of 40 MiB, requests from
// 1 byte to 33 MiB, filled with a keyed hash of position (BLAKE3's output
// stream) that never repeats within a region, so a block misplaced by any
// distance differs from the right one.
//
//   - Read and Write move Local.Len bytes between Local and Remote, byte
//     for byte and nowhere else: ReadWrite, Submits (every byte of both
//     regions compared; guards around every region).
//   - Open of a name twice returns the same handle: ReadWrite. An unknown
//     name, and CloseSegment of an unknown handle: BadInput. Requests
//     already submitted to a handle that CloseSegment forgets run to
//     their end, byte for byte; Submit then refuses the handle
//     (ErrUnknownSegment) and moves nothing, CloseSegment of it again is
//     ErrUnknownSegment, and Open of the name again gives a handle that
//     works: ClosedSegment (8 reads of 4 MiB submitted just before).
//   - Local-side errors (bad opcode, length, wrapping address, unknown
//     segment, unregistered or foreign local memory) are returned by
//     Submit, name the request, and submit nothing (Len unchanged, no
//     byte moved): BadInput.
//   - Register refuses overlaps (ErrRegistered), device memory it cannot
//     reach (ErrUnsupported), empty regions; Unregister refuses unknown
//     regions and a wrong length (ErrNotRegistered); memory registered
//     again moves bytes: BadInput.
//   - Remote-side errors end the request Failed and move nothing, and
//     Result.Bytes counts none: RemoteOutOfRange.
//   - Result.Bytes is the request's length once Completed, 0 once
//     Canceled, within [0, length] otherwise: Submits, Busy, Settled.
//   - Submit may be called several times; request i is the i-th
//     submitted; Wait covers every request submitted before it, Poll
//     reports done only when every request is final, in any order of
//     Poll and Wait; Wait with an ended context returns its error or nil
//     and the requests go on: Submits.
//   - Cap, ErrBatchFull over several Submits, Submit(nil), zero-length
//     requests, Poll after Wait, Release idempotent and final: Batch.
//   - Release and Unregister while a request is pending return ErrBusy
//     and change nothing; a nil return means every request is final (Result,
//     Poll) and nothing moves in the memory afterwards: Busy (right after a
//     Submit of 32 MiB; which answer came is logged).
//   - Engines and batches are safe for concurrent use: Concurrent.
//   - Close is idempotent; after it every call returns ErrClosed, Release
//     returns nil; a closed peer's requests never complete: Closed.
//   - Final means settled: once Wait returned nil nothing moves the
//     requests' bytes, whatever Release, Unregister and Close do next:
//     Settled, and SettledLate for engines whose transport times out while
//     bytes may still move (Options.Late).
//
// # Usage
//
// In the engine's package:
//
//	func TestConformance(t *testing.T) {
//		rdmatest.Run(t, func(t testing.TB) (rdma.Engine, rdma.Engine) {
//			f := rdma.NewFabric()
//			a, err := f.NewEngine("a", nil)
//			...
//			t.Cleanup(func() { a.Close(); b.Close() })
//			return a, b
//		}, rdmatest.Options{})
//	}
//
// Run closes engines itself in some checks; Close must be idempotent. It
// moves bytes through host memory from [rdma.AllocHost] (or Options.Alloc)
// and skips where there is none.
//
// # Concurrency
//
// Run calls open from its subtests' goroutines, one pair at a time per
// subtest, and drives the first engine of a pair from several goroutines at
// once (which is how it finds races under -race).
package rdmatest
