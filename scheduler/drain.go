package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kvconnect/kvconnect/connector"
)

// StepFunc runs one step of the engine for [Scheduler.Drain]: what the
// engine's loop does between Step and Done. It ships p.Metadata to every
// worker, computes p.Items, has every worker Save and Poll, and returns
// one Result per item with Sample set and every worker's Output. An error
// ends the drain with it.
type StepFunc func(ctx context.Context, p *Plan) ([]Result, []*connector.Output, error)

// DrainError is what [Scheduler.Drain] returns when ctx ended before
// everything in flight had finished. It wraps ctx's error.
type DrainError struct {
	// Requests are the requests that had not ended: those waiting, then
	// those loading, then those running, each in arrival order.
	Requests []connector.RequestID
	// Held are the ended or preempted requests whose blocks the connector
	// still kept: transfers touched them, saves above all.
	Held []connector.RequestID
	// Unsaved are the blocks whose saves the connector planned and no
	// Output reported, when the connector is a
	// [connector.UnsavedReporter]; nil otherwise (then Held is all the
	// engine learns). Closing the workers now loses them: they are not
	// known to be in the store.
	Unsaved []connector.Unsaved
	// Err is ctx's error.
	Err error
}

func (e *DrainError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "scheduler: Drain: %v with %d requests unfinished and %d held", e.Err, len(e.Requests), len(e.Held))
	if e.Unsaved != nil {
		n := 0
		for _, u := range e.Unsaved {
			n += len(u.Hashes)
		}
		fmt.Fprintf(&b, ", %d blocks unsaved", n)
	}
	if len(e.Held) > 0 {
		fmt.Fprintf(&b, " (held: %q", e.Held[0])
		if len(e.Held) > 1 {
			fmt.Fprintf(&b, " and %d more", len(e.Held)-1)
		}
		b.WriteString(")")
	}
	return b.String()
}

func (e *DrainError) Unwrap() error { return e.Err }

// Drained reports whether nothing is in flight: no step between Step and
// Done, no request waiting, loading or running, and no block the
// connector keeps (every save of an ended request reported). An engine
// that stops once Drained can close its workers and the connector without
// losing anything.
func (s *Scheduler) Drained() bool {
	return !s.inFlight && len(s.waiting) == 0 && len(s.loading) == 0 && len(s.running) == 0 && s.held == 0
}

// Drain finishes everything in flight before the engine stops: it runs
// the engine's steps through step, Step and Done as the engine's loop
// does, until [Scheduler.Drained]: every request added so far has ended
// (Drain neither admits nor refuses requests: those waiting run too; Abort
// them first to drop them) and the connector keeps no block, so every
// save it planned was reported by every worker. Then it returns nil, and
// the engine closes its workers and the connector: their Close cancels
// transfers not yet started and reports nothing (see
// [connector.Worker].Close), so an engine that closes before Drained
// loses the saves still in flight.
//
// A step in flight (Step called, Done not) is ended first: Drain calls step
// for it. When the scheduler is [Scheduler.Idle] and wake is not empty,
// Drain blocks as [Scheduler.Wait] does on the connector's channel and on
// wake, which must then hold the Wake channel of every worker; with no
// wake it steps without waiting.
//
// If ctx ends first, Drain returns a *[DrainError] wrapping ctx's error
// that names the requests not ended, those whose blocks the connector
// keeps, and, when the connector is a [connector.UnsavedReporter], every
// block whose save was not reported: what closing now loses. An error of
// step, Step or Done ends Drain with that error, except one wrapping
// [ErrConnector] after which Done completed the step (a report the
// scheduler ignored); Drain may be called again.
func (s *Scheduler) Drain(ctx context.Context, step StepFunc, wake ...<-chan struct{}) error {
	if ctx == nil {
		return fmt.Errorf("%w: Drain: nil context", ErrArgument)
	}
	if step == nil {
		return fmt.Errorf("%w: Drain: nil StepFunc", ErrArgument)
	}
	for {
		if err := ctx.Err(); err != nil {
			return s.drainError(err)
		}
		if !s.inFlight {
			if s.Drained() {
				return nil
			}
			if len(wake) > 0 && s.Idle() {
				if err := s.Wait(ctx, wake...); err != nil {
					return s.drainError(err)
				}
			}
			if _, err := s.Step(); err != nil {
				return err
			}
		}
		results, outs, err := step(ctx, &s.plan)
		if err != nil {
			return err
		}
		if err := s.Done(results, outs); err != nil && (s.inFlight || !errors.Is(err, ErrConnector)) {
			// Done changed nothing, or the step ended with an error the
			// engine must act on.
			return err
		}
	}
}

// drainError reports what is left when Drain's context ended with err.
func (s *Scheduler) drainError(err error) *DrainError {
	e := &DrainError{Err: err}
	for _, q := range []queue{s.waiting, s.loading, s.running} {
		for _, r := range q {
			e.Requests = append(e.Requests, r.id)
		}
	}
	for id, r := range s.reqs {
		if r.held {
			e.Held = append(e.Held, id)
		}
	}
	slices.Sort(e.Held)
	if u, ok := s.conn.(connector.UnsavedReporter); ok {
		e.Unsaved = u.Unsaved([]connector.Unsaved{})
	}
	return e
}
