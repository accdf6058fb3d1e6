package mooncake

import (
	"errors"
	"fmt"

	"github.com/kvconnect/kvconnect/rdma"
)

// ErrUnavailable is wrapped by the error Open returns when the library
// cannot be loaded (absent, a missing dependency, not a Transfer Engine C
// library, a platform without it) or the engine cannot start: the caller
// may fall back to another engine.
var ErrUnavailable = errors.New("mooncake: transfer engine unavailable")

// errUnsupported is what Open returns where the binding cannot run.
var errUnsupported = fmt.Errorf("%w: Mooncake Transfer Engine runs on linux only: %w", ErrUnavailable, errors.ErrUnsupported)

// Mooncake's C API returns codes in two conventions. submitTransfer,
// getTransferStatus and freeBatchID return a Status::Code, positive (0 is
// OK); registerLocalMemory, unregisterLocalMemory, openSegment and the
// other int functions return an ERR_* code, negative. The same condition
// has the same magnitude in both. [Error.Code] is always the negative
// form.
const (
	CodeInvalidArgument       = -1   // ERR_INVALID_ARGUMENT, Status::InvalidArgument (1)
	CodeTooManyRequests       = -2   // ERR_TOO_MANY_REQUESTS, Status::TooManyRequests (2)
	CodeAddressNotRegistered  = -3   // ERR_ADDRESS_NOT_REGISTERED, Status::AddressNotRegistered (3)
	CodeBatchBusy             = -4   // ERR_BATCH_BUSY, Status::BatchBusy (4)
	CodeDeviceNotFound        = -6   // ERR_DEVICE_NOT_FOUND, Status::DeviceNotFound (6)
	CodeAddressOverlapped     = -7   // ERR_ADDRESS_OVERLAPPED, Status::AddressOverlapped (7)
	CodeNotSupportedTransport = -8   // Status::NotSupportedTransport (8)
	CodeDNS                   = -101 // ERR_DNS, Status::Dns (101)
	CodeSocket                = -102 // ERR_SOCKET, Status::Socket (102)
	CodeMalformedJSON         = -103 // ERR_MALFORMED_JSON, Status::MalformedJson (103)
	CodeRejectHandshake       = -104 // ERR_REJECT_HANDSHAKE, Status::RejectHandshake (104)
	CodeMetadata              = -200 // ERR_METADATA, Status::Metadata (200)
	CodeEndpoint              = -201 // ERR_ENDPOINT, Status::Endpoint (201)
	CodeContext               = -202 // ERR_CONTEXT, Status::Context (202)
	CodeNUMA                  = -300 // ERR_NUMA, Status::Numa (300)
	CodeClock                 = -301 // ERR_CLOCK, Status::Clock (301)
	CodeMemory                = -302 // ERR_MEMORY, Status::Memory (302)
	CodeNotImplemented        = -303 // ERR_NOT_IMPLEMENTED; Status::NotImplemented is 999
)

var codeNames = map[int]string{
	CodeInvalidArgument:       "INVALID_ARGUMENT",
	CodeTooManyRequests:       "TOO_MANY_REQUESTS",
	CodeAddressNotRegistered:  "ADDRESS_NOT_REGISTERED",
	CodeBatchBusy:             "BATCH_BUSY",
	CodeDeviceNotFound:        "DEVICE_NOT_FOUND",
	CodeAddressOverlapped:     "ADDRESS_OVERLAPPED",
	CodeNotSupportedTransport: "NOT_SUPPORTED_TRANSPORT",
	CodeDNS:                   "DNS",
	CodeSocket:                "SOCKET",
	CodeMalformedJSON:         "MALFORMED_JSON",
	CodeRejectHandshake:       "REJECT_HANDSHAKE",
	CodeMetadata:              "METADATA",
	CodeEndpoint:              "ENDPOINT",
	CodeContext:               "CONTEXT",
	CodeNUMA:                  "NUMA",
	CodeClock:                 "CLOCK",
	CodeMemory:                "MEMORY",
	CodeNotImplemented:        "NOT_IMPLEMENTED",
}

// Operations named in [Error.Op].
const (
	opCreate     = "create"
	opTransport  = "install transport"
	opRegister   = "register"
	opUnregister = "unregister"
	opOpen       = "open segment"
	opClose      = "close segment"
	opAllocate   = "allocate batch"
	opSubmit     = "submit"
	opStatus     = "transfer status"
	opFree       = "free batch"
)

// Error is a code returned by a Transfer Engine C API call. It matches an
// rdma sentinel with [errors.Is]:
//
//	ADDRESS_NOT_REGISTERED   rdma.ErrNotRegistered
//	ADDRESS_OVERLAPPED       rdma.ErrRegistered
//	TOO_MANY_REQUESTS        rdma.ErrBatchFull
//	BATCH_BUSY               rdma.ErrBusy
//	INVALID_ARGUMENT         rdma.ErrUnknownSegment (open segment), rdma.ErrInvalidRequest (submit)
//	any code of open segment rdma.ErrUnknownSegment
//	any code of create       ErrUnavailable
type Error struct {
	Op   string // the call: "submit", "register", "open segment", ...
	Code int    // the code, in its negative form (a Status::Code c is -c)
}

// statusError returns the Error for a positive Status::Code c of op.
func statusError(op string, c int32) Error {
	code := -int(c)
	if c == 999 {
		code = CodeNotImplemented
	}
	return Error{Op: op, Code: code}
}

// Name returns Mooncake's name for the code, such as "BATCH_BUSY", or ""
// for a code this package does not know.
func (e Error) Name() string { return codeNames[e.Code] }

// Error names the call and the code.
func (e Error) Error() string {
	if name := e.Name(); name != "" {
		return fmt.Sprintf("mooncake: %s: %s (%d)", e.Op, name, e.Code)
	}
	return fmt.Sprintf("mooncake: %s: code %d", e.Op, e.Code)
}

// Unwrap returns the sentinel the code corresponds to, or nil.
func (e Error) Unwrap() error {
	switch e.Op {
	case opCreate, opTransport:
		return ErrUnavailable
	case opOpen:
		return rdma.ErrUnknownSegment
	}
	switch e.Code {
	case CodeAddressNotRegistered:
		return rdma.ErrNotRegistered
	case CodeAddressOverlapped:
		return rdma.ErrRegistered
	case CodeTooManyRequests:
		return rdma.ErrBatchFull
	case CodeBatchBusy:
		return rdma.ErrBusy
	case CodeInvalidArgument:
		if e.Op == opSubmit {
			return rdma.ErrInvalidRequest
		}
	}
	return nil
}
