package rdma

import (
	"context"
	"errors"
	"fmt"
)

// Engine is a transfer engine: it moves bytes between memory registered
// with it and the memory that other engines (peers) registered with
// theirs, without staging copies. Each engine publishes its registered
// memory as a segment under a name ([Engine.Segment]); a peer opens that
// segment by name and reads or writes it at the addresses the owner's
// memory has in the owner's process, which the two sides exchange out of
// band (the engine has no call that lists a peer's memory).
//
// Transfers go in batches: [Engine.NewBatch] reserves room for a number of
// requests, [Batch.Submit] starts them, [Batch.Poll] or [Batch.Wait]
// observes them, [Batch.Result] reports each request's status and bytes,
// and [Batch.Release] frees the batch once every request is final.
//
// Final means settled: a request is final ([Status.Final]) only once
// nothing (the engine, its transport, native code, a device) reads or
// writes its memory any more, local or remote, and nothing will. An engine
// whose transport reports a timeout while the transfer may still move
// bytes keeps the request [Pending] until the transport is done with it.
// So once Wait returns nil, or Release returns nil, the caller may reuse,
// overwrite, unregister or free the memory of every request of the batch,
// whatever their statuses; while a request is pending it must do none of
// these. A transfer that never settles (a hung device or transport) keeps
// its batch pending: Wait returns only with its context, Release and
// Unregister return [ErrBusy], and the memory stays in use.
//
// Errors on the local side are returned by the call and leave nothing
// submitted: a request whose local memory is not registered, an invalid
// opcode, an unknown segment, more requests than the batch holds, a closed
// engine. Errors on the remote side end the request with [Failed]: a
// remote address range outside the memory the peer registered, a peer
// that closed. In neither case is any byte outside registered memory read
// or written.
//
// Engines are safe for concurrent use. [Loopback] (this package) moves
// bytes between engines of one process; package rdma/shm between
// processes of one host, through shared memory; package rdma/mooncake
// binds Mooncake Transfer Engine (TCP, RDMA) across processes and hosts.
// Package rdma/rdmatest checks an implementation.
type Engine interface {
	// Segment returns the name under which peers open this engine's
	// segment with Open.
	Segment() string

	// Register makes r, host or device memory that stays allocated until
	// Unregister, readable and writable by transfers: as the local memory
	// of this engine's requests, and as the remote memory of its peers'.
	// A region that overlaps a registered one is an error wrapping
	// [ErrRegistered]; an engine that cannot reach r's location returns
	// an error wrapping [ErrUnsupported].
	Register(r Region) error

	// Unregister withdraws memory registered with Register, named by the
	// same region. While a request of this engine that is not final uses
	// the memory, it returns an error wrapping [ErrBusy] and changes
	// nothing. Peers' requests that reach the memory afterwards fail. An
	// unknown region is an error wrapping [ErrNotRegistered].
	Unregister(r Region) error

	// Open opens the segment of the peer named name (the peer's Segment)
	// and returns its handle for requests. Opening a name twice returns
	// the same handle. An unknown or unreachable peer is an error
	// wrapping [ErrUnknownSegment]. Open blocks until the peer answered or
	// ctx ends.
	Open(ctx context.Context, name string) (SegmentID, error)

	// CloseSegment forgets a handle Open returned. Requests already
	// submitted to it run to their end. An unknown handle is an error
	// wrapping [ErrUnknownSegment].
	CloseSegment(id SegmentID) error

	// NewBatch reserves a batch that holds up to size requests (size > 0).
	NewBatch(size int) (Batch, error)

	// Close stops the engine: later calls return errors wrapping
	// [ErrClosed], requests that have not started end with [Canceled]
	// where the engine can cancel them, running ones are waited for, and
	// every batch is released. Peers' requests to its segment fail from
	// then on. Close is idempotent.
	Close() error
}

// Batch is a set of transfer requests submitted together, from
// [Engine.NewBatch]. A Batch is safe for concurrent use. Its memory
// belongs to the engine until [Batch.Release] (or the engine's Close).
type Batch interface {
	// Cap returns the number of requests the batch can hold.
	Cap() int

	// Len returns the number of requests submitted so far. Request i of
	// the batch is the i-th submitted, across Submit calls.
	Len() int

	// Submit validates every request of reqs and, if all are valid, starts
	// them; otherwise it returns an error naming the first bad request and
	// submits none. A transport that fails after it queued the requests
	// (rdma/mooncake can) returns an error with the requests in the batch:
	// Len tells, and they may still run: like the others they must be
	// waited for until final before their memory is reused or the batch
	// dropped. Submit does not wait for transfers and does not retain
	// reqs. It may be called more than once while the batch has room; more
	// requests than Cap in all is an error wrapping [ErrBatchFull].
	Submit(reqs []Request) error

	// Poll reports whether every submitted request is final (settled: see
	// [Status.Final]). It does not block. Its error is the engine's
	// failure to tell, not a request's: the requests' memory must then be
	// taken to be in use.
	Poll() (done bool, err error)

	// Wait blocks until every request submitted before the call is final,
	// so that nothing touches their memory any more, or ctx ends (then it
	// returns ctx's error and the requests go on). Any other error is the
	// engine's failure to tell, as for Poll.
	Wait(ctx context.Context) error

	// Result returns the status of request i, as of the last Poll or Wait
	// that observed it (or later); i must be in [0, Len).
	Result(i int) Result

	// Release frees the batch. It returns an error wrapping [ErrBusy],
	// and frees nothing, while a request is not final; a nil error means
	// none is. Release is idempotent; the batch cannot be used afterwards
	// except for Result, and Poll and Wait, which report done when every
	// request was final.
	Release() error
}

// SegmentID is an engine's handle for a peer's segment, from
// [Engine.Open]. It is valid only with the engine that returned it. The
// zero SegmentID names no segment.
type SegmentID int32

// Op is the direction of a transfer request.
type Op uint8

const (
	// Read copies bytes from the peer's segment into local memory.
	Read Op = iota + 1
	// Write copies bytes from local memory into the peer's segment.
	Write
)

// String returns "read" or "write".
func (o Op) String() string {
	switch o {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Request is one transfer: Local.Len bytes between Local and the segment
// Segment at address Remote. The zero Request is invalid.
type Request struct {
	Op Op
	// Local is the local memory: the destination of a Read, the source of
	// a Write. It must lie inside one region registered with the engine
	// (it may be a part of one, see [Region.Sub]).
	Local Region
	// Segment is the peer's segment, from [Engine.Open].
	Segment SegmentID
	// Remote is the address of the first remote byte: an address of the
	// peer's memory in the peer's process, inside a region the peer
	// registered, exchanged out of band.
	Remote uintptr
}

// Status is where a transfer request stands. Every status but Pending is
// final: the request is settled, and no byte of its memory moves any more.
type Status uint8

const (
	// Pending: submitted and not settled: its bytes may still move. A
	// request the transport reports timed out while it may still move
	// bytes is pending.
	Pending Status = iota
	// Completed: every byte moved.
	Completed
	// Failed: the transfer failed (the remote range is not registered
	// memory of the peer, the peer closed, the transport failed). The
	// destination bytes are undefined.
	Failed
	// Timeout: the transport gave up on the request after its delivery
	// timeout, and moves none of its bytes any more. The destination
	// bytes are undefined.
	Timeout
	// Canceled: the request was dropped before it ran (its engine
	// closed). The destination bytes are untouched.
	Canceled
)

// Final reports whether s is an end state: anything but Pending. A final
// request is settled: nothing reads or writes its memory any more, and
// nothing will, so the memory may be reused.
func (s Status) Final() bool { return s != Pending }

// String returns the status in lower case, such as "completed".
func (s Status) String() string {
	switch s {
	case Pending:
		return "pending"
	case Completed:
		return "completed"
	case Failed:
		return "failed"
	case Timeout:
		return "timeout"
	case Canceled:
		return "canceled"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Result is the outcome of one transfer request.
type Result struct {
	Status Status
	Bytes  int64 // bytes moved so far; Local.Len once Completed
}

// Errors of engines and batches.
var (
	// ErrClosed: the engine was closed, or the batch released.
	ErrClosed = errors.New("rdma: engine closed")
	// ErrUnknownSegment: no segment of that name or handle.
	ErrUnknownSegment = errors.New("rdma: unknown segment")
	// ErrNotRegistered: local memory of a request, or a region to
	// unregister, is not registered with the engine.
	ErrNotRegistered = errors.New("rdma: memory not registered")
	// ErrRegistered: a region to register overlaps a registered one.
	ErrRegistered = errors.New("rdma: memory already registered")
	// ErrBatchFull: more requests than the batch holds.
	ErrBatchFull = errors.New("rdma: batch full")
	// ErrBusy: a batch cannot be released, or memory unregistered, while
	// a request that uses it is pending.
	ErrBusy = errors.New("rdma: busy")
	// ErrInvalidRequest: a request with an invalid opcode, region or
	// address.
	ErrInvalidRequest = errors.New("rdma: invalid request")
)

// CheckRequest reports what is wrong with req on its own, before any
// engine looks at it: its opcode, its local region (negative length,
// address zero, wrap-around) and its remote range. It does not check
// registration or the segment. Index i names the request in the error.
// Engines call it; it is exported for engines outside this package.
func CheckRequest(i int, req Request) error {
	switch {
	case req.Op != Read && req.Op != Write:
		return fmt.Errorf("%w: request %d: opcode %v, want rdma.Read or rdma.Write", ErrInvalidRequest, i, req.Op)
	case req.Local.Len < 0:
		return fmt.Errorf("%w: request %d: local length %d", ErrInvalidRequest, i, req.Local.Len)
	case req.Local.Len == 0:
		return nil
	case req.Local.Addr == 0:
		return fmt.Errorf("%w: request %d: %d local bytes at address 0", ErrInvalidRequest, i, req.Local.Len)
	case req.Local.End() < req.Local.Addr:
		return fmt.Errorf("%w: request %d: local [%#x, +%d) wraps around", ErrInvalidRequest, i, req.Local.Addr, req.Local.Len)
	case req.Remote == 0:
		return fmt.Errorf("%w: request %d: remote address 0", ErrInvalidRequest, i)
	case req.Remote+uintptr(req.Local.Len) < req.Remote:
		return fmt.Errorf("%w: request %d: remote [%#x, +%d) wraps around", ErrInvalidRequest, i, req.Remote, req.Local.Len)
	}
	return nil
}
