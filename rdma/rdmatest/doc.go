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
