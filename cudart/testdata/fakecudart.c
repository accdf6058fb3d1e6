/* A stand-in for libcudart, built by the tests with gcc, that checks the
 * Go side of the ABI: every symbol the binding needs, with the C
 * prototypes of the real runtime, over host memory.
 *
 *   RT_VERSION   what cudaRuntimeGetVersion reports (default 12080)
 *   BATCH_ARGS   9: export the 12.8/12.9 cudaMemcpyBatchAsync,
 *                8: export the 13.x one, 0: export none (default 0)
 *
 * "Device" memory is malloc'd; copies run at once. The current device is
 * thread-local, as in CUDA, and a copy on a stream whose device is not the
 * calling thread's current device fails with cudaErrorInvalidDevice.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef RT_VERSION
#define RT_VERSION 12080
#endif
#ifndef BATCH_ARGS
#define BATCH_ARGS 0
#endif

typedef int cudaError_t;
enum {
	ok = 0,
	invalidValue = 1,
	memoryAllocation = 2,
	invalidDevice = 101,
	invalidResourceHandle = 400,
};

#define NDEV 2
static __thread int current = 0;

struct handle {
	uint32_t magic;
	int device;
};
#define STREAM_MAGIC 0x5757u
#define EVENT_MAGIC 0xe7e7u

const char *cudaGetErrorName(cudaError_t e) {
	switch (e) {
	case 0: return "cudaSuccess";
	case 1: return "cudaErrorInvalidValue";
	case 2: return "cudaErrorMemoryAllocation";
	case 101: return "cudaErrorInvalidDevice";
	case 400: return "cudaErrorInvalidResourceHandle";
	case 600: return "cudaErrorNotReady";
	}
	return "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t e) {
	return e == 0 ? "no error" : "fake error";
}

cudaError_t cudaRuntimeGetVersion(int *v) { *v = RT_VERSION; return ok; }
cudaError_t cudaDriverGetVersion(int *v) { *v = 13000; return ok; }
cudaError_t cudaGetDeviceCount(int *n) { *n = NDEV; return ok; }

cudaError_t cudaSetDevice(int d) {
	if (d < 0 || d >= NDEV) return invalidDevice;
	current = d;
	return ok;
}

cudaError_t cudaGetDevice(int *d) { *d = current; return ok; }

cudaError_t cudaMalloc(void **p, size_t n) {
	*p = malloc(n);
	return *p ? ok : memoryAllocation;
}

cudaError_t cudaFree(void *p) { free(p); return ok; }

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) {
	if (flags & ~7u) return invalidValue;
	*p = malloc(n);
	return *p ? ok : memoryAllocation;
}

cudaError_t cudaFreeHost(void *p) { free(p); return ok; }
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags) { return p && n ? ok : invalidValue; }
cudaError_t cudaHostUnregister(void *p) { return p ? ok : invalidValue; }

static cudaError_t new_handle(void **out, uint32_t magic) {
	struct handle *h = malloc(sizeof *h);
	if (!h) return memoryAllocation;
	h->magic = magic;
	h->device = current;
	*out = h;
	return ok;
}

static cudaError_t check_handle(void *p, uint32_t magic) {
	struct handle *h = p;
	if (!h || h->magic != magic) return invalidResourceHandle;
	if (h->device != current) return invalidDevice;
	return ok;
}

static cudaError_t drop_handle(void *p, uint32_t magic) {
	cudaError_t e = check_handle(p, magic);
	if (e != ok) return e;
	((struct handle *)p)->magic = 0;
	free(p);
	return ok;
}

cudaError_t cudaStreamCreateWithFlags(void **s, unsigned int flags) {
	return flags == 1 ? new_handle(s, STREAM_MAGIC) : invalidValue;
}
cudaError_t cudaStreamDestroy(void *s) { return drop_handle(s, STREAM_MAGIC); }
cudaError_t cudaStreamSynchronize(void *s) { return ((struct handle *)s)->magic == STREAM_MAGIC ? ok : invalidResourceHandle; }
cudaError_t cudaStreamQuery(void *s) { return cudaStreamSynchronize(s); }
cudaError_t cudaStreamWaitEvent(void *s, void *e, unsigned int flags) {
	cudaError_t r = check_handle(s, STREAM_MAGIC);
	return r != ok ? r : check_handle(e, EVENT_MAGIC);
}

cudaError_t cudaEventCreateWithFlags(void **e, unsigned int flags) {
	return flags == 2 ? new_handle(e, EVENT_MAGIC) : invalidValue;
}
cudaError_t cudaEventRecord(void *e, void *s) {
	cudaError_t r = check_handle(s, STREAM_MAGIC);
	return r != ok ? r : check_handle(e, EVENT_MAGIC);
}
cudaError_t cudaEventQuery(void *e) { return ((struct handle *)e)->magic == EVENT_MAGIC ? ok : invalidResourceHandle; }
cudaError_t cudaEventSynchronize(void *e) { return cudaEventQuery(e); }
cudaError_t cudaEventDestroy(void *e) { return drop_handle(e, EVENT_MAGIC); }

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *s) {
	cudaError_t r = check_handle(s, STREAM_MAGIC);
	if (r != ok) return r;
	/* A copy onto itself stands for a copy the runtime rejects. */
	if (kind < 0 || kind > 4 || !dst || !src || dst == src) return invalidValue;
	memmove(dst, src, n);
	return ok;
}

#if BATCH_ARGS != 0
struct cudaMemLocation {
	int type;
	int id;
};
struct cudaMemcpyAttributes {
	int srcAccessOrder;
	struct cudaMemLocation srcLocHint;
	struct cudaMemLocation dstLocHint;
	unsigned int flags;
};
_Static_assert(sizeof(struct cudaMemcpyAttributes) == 24, "layout");

/* Number of batch calls, for the tests. */
int fake_batch_calls = 0;

static cudaError_t batch(void **dsts, void **srcs, size_t *sizes, size_t count,
			 struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
			 size_t *failIdx, void *stream) {
	fake_batch_calls++;
	cudaError_t r = check_handle(stream, STREAM_MAGIC);
	if (r != ok) return r;
	if (count == 0 || numAttrs != 1 || attrsIdxs[0] != 0 || attrs[0].srcAccessOrder != 1 ||
	    attrs[0].srcLocHint.type != 0 || attrs[0].dstLocHint.type != 0 || attrs[0].flags != 0)
		return invalidValue;
	for (size_t i = 0; i < count; i++) {
		if (sizes[i] == 0 || dsts[i] == srcs[i]) {
			if (failIdx) *failIdx = i;
			return invalidValue;
		}
	}
	for (size_t i = 0; i < count; i++) memmove(dsts[i], srcs[i], sizes[i]);
	return ok;
}

#if BATCH_ARGS == 9
cudaError_t cudaMemcpyBatchAsync(void **dsts, void **srcs, size_t *sizes, size_t count,
				 struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
				 size_t *failIdx, void *stream) {
	if (!failIdx) return invalidValue;
	return batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream);
}
#else
cudaError_t cudaMemcpyBatchAsync(const void *const *dsts, const void *const *srcs, const size_t *sizes,
				 size_t count, struct cudaMemcpyAttributes *attrs, size_t *attrsIdxs,
				 size_t numAttrs, void *stream) {
	return batch((void **)dsts, (void **)srcs, (size_t *)sizes, count, attrs, attrsIdxs, numAttrs, NULL,
		     stream);
}
#endif
#endif
