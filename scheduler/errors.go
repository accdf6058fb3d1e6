package scheduler

import "errors"

// Errors the package returns, wrapped with the offending value; match them
// with [errors.Is].
var (
	// ErrConfig: a Config field is missing or out of range.
	ErrConfig = errors.New("scheduler: invalid config")
	// ErrArgument: an argument of a call is out of its range (a nil
	// context, a nil function).
	ErrArgument = errors.New("scheduler: invalid argument")
	// ErrUnknownRequest: a call names a request the scheduler does not know.
	ErrUnknownRequest = errors.New("scheduler: unknown request")
	// ErrDuplicateRequest: Add of a request ID that is still known (a
	// finished request stays known until the connector releases its blocks).
	ErrDuplicateRequest = errors.New("scheduler: duplicate request")
	// ErrEnded: a request that already ended (finished, failed or aborted)
	// is finished or aborted again.
	ErrEnded = errors.New("scheduler: request already ended")
	// ErrBadResult: Done got a result that the step's plan does not call
	// for, or misses one it does.
	ErrBadResult = errors.New("scheduler: bad result")
	// ErrInvalidBlock: a block id lies outside the pool, or the block is
	// not in the state the call needs (a reference on a free block, say).
	ErrInvalidBlock = errors.New("scheduler: invalid block")
	// ErrNoBlocks: the pool cannot hand out as many blocks as asked.
	ErrNoBlocks = errors.New("scheduler: not enough free blocks")
	// ErrTooLarge: a request needs more blocks than the whole pool holds.
	ErrTooLarge = errors.New("scheduler: request larger than the pool")
	// ErrStepInFlight: Step, Abort or Invalidate was called between a Step
	// and its Done.
	ErrStepInFlight = errors.New("scheduler: step in flight")
	// ErrNoStep: Done was called without a Step before it.
	ErrNoStep = errors.New("scheduler: no step in flight")
	// ErrLoadFailed: a request failed because its external KV failed to
	// load under the connector's fail policy. Found in [Ended.Err].
	ErrLoadFailed = errors.New("scheduler: external KV failed to load")
	// ErrConnector: the connector returned an error, or reported something
	// that contradicts the scheduler's state (a release of a request whose
	// blocks it never kept, say). Found in [Ended.Err] for the request it
	// ended, or returned by Done after the step was otherwise completed.
	ErrConnector = errors.New("scheduler: connector")
	// ErrRankLost: the Outputs of a worker rank did not come for
	// Config.RankSteps steps while it owed transfers; see [RankLostError].
	ErrRankLost = errors.New("scheduler: worker rank lost")
	// ErrGeneration: Invalidate was asked for a generation that is not newer
	// than the current one.
	ErrGeneration = errors.New("scheduler: generation not newer")
)
