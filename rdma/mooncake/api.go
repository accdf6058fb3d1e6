package mooncake

import (
	"fmt"
	"unsafe"
)

// api is the part of the C API of Mooncake Transfer Engine
// (mooncake-transfer-engine/include/transfer_engine_c.h) that the binding
// calls, one field per function, each under its C prototype. Every pointer
// argument is an address of memory outside the Go heap; size_t is uintptr,
// int is int32, segment_id_t is int32, batch_id_t is uint64.
type api struct {
	// transfer_engine_t createTransferEngine(const char *metadata_conn_string,
	//     const char *local_server_name, const char *ip_or_host_name,
	//     uint64_t rpc_port, int auto_discover);
	createTransferEngine func(metadataConnString, localServerName, ipOrHostName uintptr, rpcPort uint64, autoDiscover int32) uintptr
	// int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);
	getLocalIpAndPort func(engine, bufOut, bufLen uintptr) int32
	// transport_t installTransport(transfer_engine_t engine, const char *proto, void **args);
	installTransport func(engine, proto, args uintptr) uintptr
	// segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);
	openSegment func(engine, segmentName uintptr) int32
	// int closeSegment(transfer_engine_t engine, segment_id_t segment_id);
	closeSegment func(engine uintptr, segmentID int32) int32
	// void destroyTransferEngine(transfer_engine_t engine);
	destroyTransferEngine func(engine uintptr)
	// int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length,
	//     const char *location, int remote_accessible);
	registerLocalMemory func(engine, addr, length, location uintptr, remoteAccessible int32) int32
	// int unregisterLocalMemory(transfer_engine_t engine, void *addr);
	unregisterLocalMemory func(engine, addr uintptr) int32
	// batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);
	allocateBatchID func(engine, batchSize uintptr) uint64
	// int submitTransfer(transfer_engine_t engine, batch_id_t batch_id,
	//     struct transfer_request *entries, size_t count);
	submitTransfer func(engine uintptr, batchID uint64, entries, count uintptr) int32
	// int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id,
	//     size_t task_id, struct transfer_status *status);
	getTransferStatus func(engine uintptr, batchID uint64, taskID, status uintptr) int32
	// int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);
	freeBatchID func(engine uintptr, batchID uint64) int32
}

// symbols pairs each C name with its field of a.
func (a *api) symbols() []struct {
	name string
	fn   any
} {
	return []struct {
		name string
		fn   any
	}{
		{"createTransferEngine", &a.createTransferEngine},
		{"getLocalIpAndPort", &a.getLocalIpAndPort},
		{"installTransport", &a.installTransport},
		{"openSegment", &a.openSegment},
		{"closeSegment", &a.closeSegment},
		{"destroyTransferEngine", &a.destroyTransferEngine},
		{"registerLocalMemory", &a.registerLocalMemory},
		{"unregisterLocalMemory", &a.unregisterLocalMemory},
		{"allocateBatchID", &a.allocateBatchID},
		{"submitTransfer", &a.submitTransfer},
		{"getTransferStatus", &a.getTransferStatus},
		{"freeBatchID", &a.freeBatchID},
	}
}

// Constants of transfer_engine_c.h.
const (
	opcodeRead  = 0 // OPCODE_READ
	opcodeWrite = 1 // OPCODE_WRITE

	invalidBatch = ^uint64(0) // INVALID_BATCH

	statusWaiting   = 0 // STATUS_WAITING
	statusPending   = 1 // STATUS_PENDING
	statusInvalid   = 2 // STATUS_INVALID
	statusCanceled  = 3 // STATUS_CANCELED
	statusCompleted = 4 // STATUS_COMPLETED
	statusTimeout   = 5 // STATUS_TIMEOUT
	statusFailed    = 6 // STATUS_FAILED
)

// request is struct transfer_request, 40 bytes on 64-bit targets:
//
//	offset  bound header (commit 3b5a5941)   later headers
//	0       int opcode                        int opcode
//	8       void *source                      void *source
//	16      segment_id_t target_id            segment_id_t target_id
//	20      (padding)                         file_id_t file_id
//	24      uint64_t target_offset            uint64_t target_offset
//	32      uint64_t length                   uint64_t length
//
// The binding writes zero at offset 20, which later headers read as "no
// file": both layouts receive the same request.
type request struct {
	opcode       int32
	_            int32
	source       uintptr
	targetID     int32
	fileID       uint32
	targetOffset uint64
	length       uint64
}

// status is struct transfer_status, 16 bytes.
type status struct {
	status           int32
	_                int32
	transferredBytes uint64
}

const (
	requestSize = 40
	statusSize  = 16
)

// checkLayout reports an error unless request and status have the C
// layout of a 64-bit target. Open calls it before anything else.
func checkLayout() error {
	var r request
	var s status
	got := [...]uintptr{
		unsafe.Sizeof(r), unsafe.Offsetof(r.source), unsafe.Offsetof(r.targetID),
		unsafe.Offsetof(r.fileID), unsafe.Offsetof(r.targetOffset), unsafe.Offsetof(r.length),
		unsafe.Sizeof(s), unsafe.Offsetof(s.transferredBytes),
	}
	want := [...]uintptr{requestSize, 8, 16, 20, 24, 32, statusSize, 8}
	if got != want {
		return fmt.Errorf("struct layout %v, want %v (transfer_request of 40 bytes, transfer_status of 16): a 64-bit target is required", got, want)
	}
	return nil
}
