package mooncake

import (
	"errors"
	"fmt"

	"github.com/kvconnect/kvconnect/store"
)

// Codes that Mooncake Store's C API returns (mooncake::ErrorCode).
const (
	CodeInternal            = -1   // INTERNAL_ERROR; also any C++ exception caught by the C API
	CodeNoAvailableHandle   = -200 // NO_AVAILABLE_HANDLE: no space for the value
	CodeInvalidKey          = -400 // INVALID_KEY
	CodeInvalidParams       = -600 // INVALID_PARAMS: bad argument, unregistered buffer, buffer too small
	CodeReplicaNotReady     = -703 // REPLICA_IS_NOT_READY: a put of the key is still in flight
	CodeObjectNotFound      = -704 // OBJECT_NOT_FOUND
	CodeObjectAlreadyExists = -705 // OBJECT_ALREADY_EXISTS
	CodeObjectHasLease      = -706 // OBJECT_HAS_LEASE: removal refused while a read lease is held
	CodeLeaseExpired        = -707 // LEASE_EXPIRED: the lease ran out before the transfer finished
	CodeTransferFail        = -800 // TRANSFER_FAIL
	CodeChecksumMismatch    = -801 // CHECKSUM_MISMATCH
	CodeRPCFail             = -900 // RPC_FAIL
	CodeRPCTimeout          = -901 // RPC_TIMEOUT
)

var codeNames = map[int]string{
	CodeInternal:            "INTERNAL_ERROR",
	CodeNoAvailableHandle:   "NO_AVAILABLE_HANDLE",
	CodeInvalidKey:          "INVALID_KEY",
	CodeInvalidParams:       "INVALID_PARAMS",
	-601:                    "ILLEGAL_CLIENT",
	-702:                    "INVALID_REPLICA",
	CodeReplicaNotReady:     "REPLICA_IS_NOT_READY",
	CodeObjectNotFound:      "OBJECT_NOT_FOUND",
	CodeObjectAlreadyExists: "OBJECT_ALREADY_EXISTS",
	CodeObjectHasLease:      "OBJECT_HAS_LEASE",
	CodeLeaseExpired:        "LEASE_EXPIRED",
	-710:                    "REPLICA_NOT_FOUND",
	-712:                    "REPLICA_IS_GONE",
	CodeTransferFail:        "TRANSFER_FAIL",
	CodeChecksumMismatch:    "CHECKSUM_MISMATCH",
	CodeRPCFail:             "RPC_FAIL",
	CodeRPCTimeout:          "RPC_TIMEOUT",
}

// Operations named in [Error.Op].
const (
	opCreate   = "create"
	opSetup    = "setup"
	opExists   = "exists"
	opPut      = "put"
	opGet      = "get"
	opRemove   = "remove"
	opRegex    = "remove by regex"
	opAll      = "remove all"
	opRegister = "register buffer"
	opUnreg    = "unregister buffer"
)

// Error is a negative code returned by a Mooncake Store C API call.
// It matches the store sentinel for its code with [errors.Is]:
//
//	-704, -703          store.ErrNotFound
//	-200                store.ErrNoSpace
//	-707                store.ErrLeaseExpired
//	-706                store.ErrHasLease
//	-600                store.ErrBufferTooSmall (get), store.ErrInvalidRegion
//	                    (put, register), store.ErrInvalidKey (other calls)
//	-400                store.ErrInvalidKey
//	-1, -800, -900, ... store.ErrTransfer (every other code)
//
// Errors of create and setup match store.ErrUnavailable whatever the code:
// the client could not be started.
type Error struct {
	Op   string // the call: "setup", "put", "get", "exists", "remove", ...
	Code int    // the negative code the C API returned
}

// Name returns Mooncake's name for the code, such as "OBJECT_NOT_FOUND",
// or "" for a code this package does not know.
func (e Error) Name() string { return codeNames[e.Code] }

func (e Error) Error() string {
	if name := e.Name(); name != "" {
		return fmt.Sprintf("mooncake: %s: %s (%d)", e.Op, name, e.Code)
	}
	return fmt.Sprintf("mooncake: %s: code %d", e.Op, e.Code)
}

// Unwrap returns the store sentinel the code corresponds to.
func (e Error) Unwrap() error {
	switch e.Op {
	case opCreate, opSetup:
		return store.ErrUnavailable
	}
	switch e.Code {
	case CodeObjectNotFound, CodeReplicaNotReady:
		return store.ErrNotFound
	case CodeNoAvailableHandle:
		return store.ErrNoSpace
	case CodeLeaseExpired:
		return store.ErrLeaseExpired
	case CodeObjectHasLease:
		return store.ErrHasLease
	case CodeInvalidKey:
		return store.ErrInvalidKey
	case CodeInvalidParams:
		switch e.Op {
		case opGet:
			return store.ErrBufferTooSmall
		case opPut, opRegister, opUnreg:
			return store.ErrInvalidRegion
		}
		return store.ErrInvalidKey
	}
	return store.ErrTransfer
}

// errUnsupported is what Open returns where the binding cannot run.
var errUnsupported = fmt.Errorf("%w: Mooncake Store runs on linux only: %w", store.ErrUnavailable, errors.ErrUnsupported)
