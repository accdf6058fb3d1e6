package scheduler

import (
	"context"
	"fmt"
	"reflect"

	"github.com/kvconnect/kvconnect/connector"
)

// Idle reports whether the next Step would plan nothing to compute until
// news comes: the last step planned no item, and nothing that could make
// a request runnable happened since (an Add, an Abort, an Invalidate, or
// a Done whose connector Progress reported a load or a release, or that
// ended a request). What it then waits for comes from outside: a lookup
// of the connector, a transfer of a worker, a new request. An engine that
// finds it idle may block ([Scheduler.Wait]) instead of stepping. With no
// request at all it is true; between Step and Done it is false, and so it
// is while a worker rank that owes transfers sent no Output to the last
// Done (see Config.RankSteps).
func (s *Scheduler) Idle() bool {
	if s.inFlight {
		return false
	}
	if s.ranks.missing(s.step) {
		// A rank that owes transfers sent nothing to the last Done: step
		// on, toward Config.RankSteps.
		return false
	}
	// The plan's Items are the last step's until the next Step.
	return len(s.reqs) == 0 || s.step > 0 && len(s.plan.Items) == 0 && !s.news
}

// Wake returns the connector's wake-up channel ([connector.Waker]), or nil
// when the scheduler has no connector or one that is not a Waker. A
// connector Invalidate detached still plans and updates what it holds, so
// its channel counts too.
func (s *Scheduler) Wake() <-chan struct{} {
	if s.conn == nil {
		return nil
	}
	if w, ok := s.conn.(connector.Waker); ok {
		return w.Wake()
	}
	return nil
}

// Wait blocks while the scheduler is [Scheduler.Idle], until the
// connector's Waker, one of wake, or ctx fires, and returns ctx's error if
// ctx ended it. It returns at once when the scheduler is not idle, and
// when it has a connector that is not a Waker: the engine then steps to
// poll, as without Wait. wake must hold the Wake channels of every worker
// of the engine that drives transfers ([connector.Waker]; a worker that is
// not a Waker cannot be waited on: do not call Wait then) and whatever
// brings the engine new requests. After Wait returns the engine steps:
// the step polls the workers and asks the connector again.
//
// A closed channel (a Waker's, once its half is closed) ends the wait
// with an error wrapping [connector.ErrClosed]: stepping on would find the
// connector closed. A nil ctx is an error wrapping [ErrArgument], and so
// is an idle scheduler with nothing to wait on (no connector that is a
// Waker and no wake channel other than nil): only ctx could end that wait.
func (s *Scheduler) Wait(ctx context.Context, wake ...<-chan struct{}) error {
	if ctx == nil {
		return fmt.Errorf("%w: Wait: nil context", ErrArgument)
	}
	if !s.Idle() {
		return nil
	}
	conn := s.Wake()
	if conn == nil && s.conn != nil {
		return nil
	}
	cases := make([]reflect.SelectCase, 0, len(wake)+2)
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
	if conn != nil {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(conn)})
	}
	for _, c := range wake {
		if c != nil {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
		}
	}
	if len(cases) == 1 {
		return fmt.Errorf("%w: Wait: nothing to wait on (no connector Waker, %d wake channels, none of them non-nil) and nothing to compute: it would block until ctx ends", ErrArgument, len(wake))
	}
	i, _, ok := reflect.Select(cases)
	switch {
	case i == 0:
		return ctx.Err()
	case !ok && conn != nil && i == 1:
		return fmt.Errorf("scheduler: Wait: the connector's Wake channel is closed: %w", connector.ErrClosed)
	case !ok:
		return fmt.Errorf("scheduler: Wait: a wake channel is closed: %w", connector.ErrClosed)
	}
	return nil
}
