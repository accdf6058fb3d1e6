package cudart

import "github.com/kvconnect/kvconnect/internal/dl"

// table is the binding's symbol table: one Go function per C function of
// libcudart, bound by purego at Open. Unit tests fill it with Go fakes.
//
// Pointers: a *int32 or *uintptr argument is an out-parameter that the C
// function writes during the call (purego passes the address of a Go
// variable and keeps it alive until the call returns; nothing keeps it
// afterwards). A uintptr argument that is a memory address (dst, src, ptr)
// is memory outside the Go heap: device memory, or host memory from
// cudaHostAlloc or mmap. The descriptor arrays of the batch copy are views
// of memory the Stream maps outside the Go heap; the bytes they point to
// are never Go memory either.
type table struct {
	// const char *cudaGetErrorName(cudaError_t error);
	getErrorName func(code int32) string
	// const char *cudaGetErrorString(cudaError_t error);
	getErrorString func(code int32) string
	// cudaError_t cudaRuntimeGetVersion(int *runtimeVersion);
	runtimeGetVersion func(v *int32) int32
	// cudaError_t cudaDriverGetVersion(int *driverVersion);
	driverGetVersion func(v *int32) int32
	// cudaError_t cudaGetDeviceCount(int *count);
	getDeviceCount func(n *int32) int32
	// cudaError_t cudaSetDevice(int device);
	setDevice func(device int32) int32
	// cudaError_t cudaGetDevice(int *device);
	getDevice func(device *int32) int32

	// cudaError_t cudaMalloc(void **devPtr, size_t size);
	malloc func(p *uintptr, size uintptr) int32
	// cudaError_t cudaFree(void *devPtr);
	free func(p uintptr) int32
	// cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
	hostAlloc func(p *uintptr, size uintptr, flags uint32) int32
	// cudaError_t cudaFreeHost(void *ptr);
	freeHost func(p uintptr) int32
	// cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags);
	hostRegister func(p uintptr, size uintptr, flags uint32) int32
	// cudaError_t cudaHostUnregister(void *ptr);
	hostUnregister func(p uintptr) int32

	// cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
	//     enum cudaMemcpyKind kind, cudaStream_t stream);
	memcpyAsync func(dst, src, n uintptr, kind int32, stream uintptr) int32

	// cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
	streamCreateWithFlags func(s *uintptr, flags uint32) int32
	// cudaError_t cudaStreamDestroy(cudaStream_t stream);
	streamDestroy func(s uintptr) int32
	// cudaError_t cudaStreamSynchronize(cudaStream_t stream);
	streamSynchronize func(s uintptr) int32
	// cudaError_t cudaStreamQuery(cudaStream_t stream);
	streamQuery func(s uintptr) int32
	// cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
	streamWaitEvent func(s, e uintptr, flags uint32) int32

	// cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
	eventCreateWithFlags func(e *uintptr, flags uint32) int32
	// cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
	eventRecord func(e, s uintptr) int32
	// cudaError_t cudaEventQuery(cudaEvent_t event);
	eventQuery func(e uintptr) int32
	// cudaError_t cudaEventSynchronize(cudaEvent_t event);
	eventSynchronize func(e uintptr) int32
	// cudaError_t cudaEventDestroy(cudaEvent_t event);
	eventDestroy func(e uintptr) int32

	// Optional (CUDA 12.8 and later). The one C symbol has two prototypes;
	// both fields are bound to it and the runtime version picks the one
	// that is called (see batchFormFor).
	//
	// 12.8, 12.9:
	// cudaError_t cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count,
	//     struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
	//     size_t *failIdx, cudaStream_t stream);
	memcpyBatchAsync9 func(dsts, srcs, sizes []uintptr, count uintptr, attrs *memcpyAttributes,
		attrsIdxs *uintptr, numAttrs uintptr, failIdx *uintptr, stream uintptr) int32
	// 13.x:
	// cudaError_t cudaMemcpyBatchAsync(const void *const *dsts, const void *const *srcs,
	//     const size_t *sizes, size_t count, struct cudaMemcpyAttributes *attrs,
	//     size_t *attrsIdxs, size_t numAttrs, cudaStream_t stream);
	memcpyBatchAsync8 func(dsts, srcs, sizes []uintptr, count uintptr, attrs *memcpyAttributes,
		attrsIdxs *uintptr, numAttrs uintptr, stream uintptr) int32
}

// batchSymbol is the C name of the optional batch copy.
const batchSymbol = "cudaMemcpyBatchAsync"

// symbols lists the required symbols of t.
func (t *table) symbols() []dl.Symbol {
	return []dl.Symbol{
		{Name: "cudaGetErrorName", Fn: &t.getErrorName},
		{Name: "cudaGetErrorString", Fn: &t.getErrorString},
		{Name: "cudaRuntimeGetVersion", Fn: &t.runtimeGetVersion},
		{Name: "cudaDriverGetVersion", Fn: &t.driverGetVersion},
		{Name: "cudaGetDeviceCount", Fn: &t.getDeviceCount},
		{Name: "cudaSetDevice", Fn: &t.setDevice},
		{Name: "cudaGetDevice", Fn: &t.getDevice},
		{Name: "cudaMalloc", Fn: &t.malloc},
		{Name: "cudaFree", Fn: &t.free},
		{Name: "cudaHostAlloc", Fn: &t.hostAlloc},
		{Name: "cudaFreeHost", Fn: &t.freeHost},
		{Name: "cudaHostRegister", Fn: &t.hostRegister},
		{Name: "cudaHostUnregister", Fn: &t.hostUnregister},
		{Name: "cudaMemcpyAsync", Fn: &t.memcpyAsync},
		{Name: "cudaStreamCreateWithFlags", Fn: &t.streamCreateWithFlags},
		{Name: "cudaStreamDestroy", Fn: &t.streamDestroy},
		{Name: "cudaStreamSynchronize", Fn: &t.streamSynchronize},
		{Name: "cudaStreamQuery", Fn: &t.streamQuery},
		{Name: "cudaStreamWaitEvent", Fn: &t.streamWaitEvent},
		{Name: "cudaEventCreateWithFlags", Fn: &t.eventCreateWithFlags},
		{Name: "cudaEventRecord", Fn: &t.eventRecord},
		{Name: "cudaEventQuery", Fn: &t.eventQuery},
		{Name: "cudaEventSynchronize", Fn: &t.eventSynchronize},
		{Name: "cudaEventDestroy", Fn: &t.eventDestroy},
	}
}

// memcpyAttributes is struct cudaMemcpyAttributes (driver_types.h, CUDA
// 12.8 and 13.x alike): 24 bytes, 4-byte aligned.
//
//	struct cudaMemcpyAttributes {
//	    enum cudaMemcpySrcAccessOrder srcAccessOrder; // offset 0
//	    struct cudaMemLocation srcLocHint;            // offset 4: {enum type; int id;}
//	    struct cudaMemLocation dstLocHint;            // offset 12
//	    unsigned int flags;                           // offset 20
//	};
type memcpyAttributes struct {
	srcAccessOrder int32
	srcLocHint     memLocation
	dstLocHint     memLocation
	flags          uint32
}

// memLocation is struct cudaMemLocation { enum cudaMemLocationType type; int id; }.
type memLocation struct {
	typ int32
	id  int32
}

// srcAccessOrderStream is cudaMemcpySrcAccessOrderStream: sources are read
// in stream order, when the copy runs, as cudaMemcpyAsync does.
const srcAccessOrderStream = 1

// Flags passed to the create calls.
const (
	streamNonBlocking  = 1 // cudaStreamNonBlocking
	eventDisableTiming = 2 // cudaEventDisableTiming
)
