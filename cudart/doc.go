// Package cudart binds the parts of the CUDA runtime (libcudart) that a KV
// connector needs to move blocks between GPU memory and host memory:
// devices, streams, events, pinned host memory (allocated, or registered
// from an existing mapping such as mmap), device memory, asynchronous
// copies in every direction, and batched block copies. It is for engines
// and connectors that keep KV blocks on a GPU; CPU-only users never import
// it.
//
// The library is loaded at run time with purego: there is no cgo, the
// package builds on every system, and a program that never calls [Open]
// never touches the library. Off Linux, Open returns [ErrUnsupported].
//
// # Usage
//
//	rt, err := cudart.Open()
//	if errors.Is(err, cudart.ErrUnavailable) {
//		// no libcudart: run on the CPU
//	}
//	dev, err := rt.Device(0) // cudart.IsNoGPU(err): a library but no GPU
//	host, err := dev.HostAlloc(64<<20, cudart.HostAllocPortable)
//	gpu, err := dev.Malloc(64 << 20)
//	s, err := dev.NewStream()
//	err = s.CopyToDevice([]cudart.Copy{
//		{Dst: gpu.Addr(), Src: host.Addr(), N: 2 << 20},
//		{Dst: gpu.Addr() + 2<<20, Src: host.Addr() + 8<<20, N: 2 << 20},
//	})
//	done, err := dev.NewEvent()
//	err = done.Record(s)
//	// later, or from another goroutine:
//	ok, err := done.Query() // non-blocking
//	err = done.Wait(ctx)
//
// Open looks for the library in CUDART_PATH (a file or a folder), then
// libcudart.so.13, .so.12 and .so.11.0 on the dynamic linker's search path,
// then in $CUDA_HOME and /usr/local/cuda. Debian's libcudart11.0 package
// (non-free) provides libcudart.so.11.0.
//
// # Batches
//
// [Stream.CopyBatch] issues many block copies with one native call where
// the runtime has cudaMemcpyBatchAsync (CUDA 12.8 and later): its C
// prototype has nine arguments on 12.8 and 12.9 and eight on 13.x, and the
// binding picks the one that matches the version the library reports.
// Elsewhere it issues one cudaMemcpyAsync per copy, under a single thread
// lock and device switch. [Copy] is an alias of an unnamed struct, and the
// connector-facing methods take only such types, so packages can declare
// interfaces that [*Stream] and [*Event] satisfy without importing cudart.
// A connector's worker stages device KV memory through
// connector/cudacopy's Copier, which runs each batch of copies on a
// stream of its own from this package.
//
// # Memory
//
// Addresses handed to this package are plain uintptr values for memory
// outside the Go heap: device memory ([Device.Malloc]), pinned host memory
// ([Device.HostAlloc]) or host memory mapped by other means and pinned with
// [Device.HostRegister]. Copies run after the call that issues them
// returns, so their source and destination must never be Go memory, which
// the garbage collector may free. Out-parameters are different: a C
// function that writes a result (cudaMalloc's void**, cudaGetDeviceCount's
// int*) is given the address of a Go variable, which purego keeps alive for
// the duration of the call and which the C side does not keep. The
// descriptor arrays of a batch copy (addresses, sizes, attributes) live in
// memory each Stream maps outside the Go heap.
//
// # Errors
//
// A failed call returns an [*Error] with the C function and its [Code].
// Codes have names without the library ([Code.String] gives the C name).
// [IsNoDriver], [IsNoDevice] and [IsNoGPU] tell a machine without a usable
// GPU apart from a real failure; [IsNotReady] marks unfinished work.
//
// # Concurrency
//
// The methods of Runtime, Device, Stream, Event and the memory types are
// safe for concurrent use, except Close, Free and Unregister: those must not
// overlap another call on their value, must be the last one, and are
// idempotent. The current device is per OS thread in CUDA:
// every call that depends on it locks the goroutine to its thread, sets the
// device and makes the call, so goroutines never see each other's device.
// Calls block their OS thread while in native code; Wait and Synchronize
// with a cancelable context poll instead of blocking in the driver.
package cudart
