package storeconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/store"
)

// health counts a half's store calls that failed, for Stats and Health, and
// logs them at warn level, at most one line a second.
type health struct {
	log *slog.Logger
	lim limiter
	mu  struct {
		sync.Mutex
		h        connector.Health
		errors   int64
		timeouts int64
	}
}

// storeFailed reports whether err, from a store call, is the store failing
// rather than the call being canceled by Close.
func storeFailed(err error) bool {
	return err != nil && !errors.Is(err, context.Canceled)
}

// keyFailed reports whether a per-key error means the store is failing: a
// key that is absent, out of space or whose lease ran out is the store
// working as a cache.
func keyFailed(err error) bool {
	switch {
	case err == nil, errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrNoSpace),
		errors.Is(err, store.ErrLeaseExpired), errors.Is(err, store.ErrHasLease):
		return false
	}
	return true
}

// record notes the outcome of one store call op (exists, get, put): err is
// the whole call's error, or the first per-key error that means the store
// is failing.
func (h *health) record(op string, err error) {
	if !storeFailed(err) {
		h.mu.Lock()
		h.mu.h.ConsecutiveFailures = 0
		h.mu.Unlock()
		return
	}
	timeout := errors.Is(err, context.DeadlineExceeded)
	now := time.Now()
	h.mu.Lock()
	h.mu.errors++
	if timeout {
		h.mu.timeouts++
	}
	h.mu.h.ConsecutiveFailures++
	h.mu.h.Failures++
	h.mu.h.LastError = fmt.Errorf("store %s: %w", op, err)
	h.mu.h.LastErrorTime = now
	n := h.mu.h.ConsecutiveFailures
	h.mu.Unlock()
	if ok, suppressed := h.lim.allow(now); ok {
		h.log.Warn("storeconn: store call failed; lookups count it as a miss, loads as failed blocks", "op", op, "err", err, "consecutive", n, "suppressed", suppressed)
	}
}

func (h *health) get() connector.Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.h
}

func (h *health) counts() (errors, timeouts int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.errors, h.mu.timeouts
}

// firstKeyFailure is the first per-key error of res that means the store
// is failing, or nil.
func firstKeyFailure(res []store.Result) error {
	for _, r := range res {
		if keyFailed(r.Err) {
			return r.Err
		}
	}
	return nil
}

// waitGroup waits for wg for at most d; it reports whether wg is done.
func waitGroup(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
