package rdmatest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
)

// regionSize is the size of the regions of the checks at real sizes: more
// than 32 MiB, so that a transfer of a real KV block (256 KiB to several
// MiB) or of many of them lands among others.
const regionSize = 40 << 20

// waitBound is how long a check waits for a condition that a correct
// engine reaches however slow the machine is.
const waitBound = time.Minute

// checkBytes fails unless r.Bytes agrees with r.Status for req: all of its
// bytes once completed, none once canceled, between none and all
// otherwise.
func checkBytes(t testing.TB, what string, req rdma.Request, r rdma.Result) {
	t.Helper()
	n := int64(req.Local.Len)
	switch {
	case r.Status == rdma.Completed && r.Bytes != n:
		t.Errorf("%s (%v, %d bytes) = %+v: a completed request moved all of its %d bytes", what, req.Op, n, r, n)
	case r.Status == rdma.Canceled && r.Bytes != 0:
		t.Errorf("%s (%v, %d bytes) = %+v: a canceled request moved no byte", what, req.Op, n, r)
	case r.Bytes < 0 || r.Bytes > n:
		t.Errorf("%s (%v, %d bytes) = %+v: Result.Bytes is outside [0, %d]", what, req.Op, n, r, n)
	}
}

// pollDone calls b.Poll until it reports done, for a minute at most.
func pollDone(t testing.TB, b rdma.Batch, what string) {
	t.Helper()
	tick := time.NewTicker(100 * time.Microsecond)
	defer tick.Stop()
	deadline := time.Now().Add(waitBound)
	for {
		done, err := b.Poll()
		if err != nil {
			t.Fatalf("%s: Poll = %v", what, err)
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: Poll did not report done within %v", what, waitBound)
		}
		<-tick.C
	}
}

// place is a request of a check at real sizes: Op of size bytes between
// offset local of the local region and offset remote of the peer's.
type place struct {
	op            rdma.Op
	local, remote int
	size          int
}

// submits checks one batch that takes several Submits of transfers of real
// sizes, observed by Poll and Wait in turn: Poll between two Submits, Wait
// after the second, which covers the requests of both, Wait with a context
// that already ended, and Poll alone to the end of a third.
func (s *suite) submits(t testing.TB) {
	a, b := s.open(t)
	const n, mb = regionSize, 1 << 20
	am, ar := s.guarded(t, a, n, 0x13)
	bm, br := s.guarded(t, b, n, 0x24)
	fillPattern(ar.Bytes(), 3)
	fillPattern(br.Bytes(), 4)
	seg := openSeg(t, a, b.Segment())
	wantA, wantB := bytes.Clone(ar.Bytes()), bytes.Clone(br.Bytes())
	// No request reads what another writes.
	submits := [][]place{
		{
			{rdma.Read, 0, 0, 33*mb + 7},
			{rdma.Write, 34 * mb, 36 * mb, mb + 3},
		},
		{
			{rdma.Read, 36 * mb, 33*mb + 4096, mb + 5},
		},
		{
			{rdma.Write, 35*mb + 65536, 35 * mb, mb/2 + 1},
			{rdma.Read, 38 * mb, 37*mb + 8192, mb},
		},
	}
	var reqs []rdma.Request
	for _, sub := range submits {
		for _, p := range sub {
			l, err := ar.Sub(p.local, p.size)
			if err != nil {
				t.Fatal(err)
			}
			reqs = append(reqs, rdma.Request{Op: p.op, Local: l, Segment: seg, Remote: br.Addr + uintptr(p.remote)})
			if p.op == rdma.Read {
				copy(wantA[p.local:p.local+p.size], wantB[p.remote:p.remote+p.size])
			} else {
				copy(wantB[p.remote:p.remote+p.size], wantA[p.local:p.local+p.size])
			}
		}
	}
	batch, err := a.NewBatch(len(reqs) + 1)
	if err != nil {
		t.Fatal(err)
	}
	// check checks the requests [0, upto) after an observation said they
	// are final.
	check := func(upto int, after string) {
		t.Helper()
		for i := range upto {
			r := batch.Result(i)
			if r.Status != rdma.Completed {
				t.Errorf("after %s: request %d (%v, %d bytes) = %+v, want completed", after, i, reqs[i].Op, reqs[i].Local.Len, r)
			}
			checkBytes(t, fmt.Sprintf("after %s: request %d", after, i), reqs[i], r)
			p := reqs[i]
			lo := int(p.Local.Addr - ar.Addr)
			ro := int(p.Remote - br.Addr)
			var got, want []byte
			if p.Op == rdma.Read {
				got, want = ar.Bytes()[lo:lo+p.Local.Len], wantA[lo:lo+p.Local.Len]
			} else {
				got, want = br.Bytes()[ro:ro+p.Local.Len], wantB[ro:ro+p.Local.Len]
			}
			if !bytes.Equal(got, want) {
				t.Errorf("after %s: request %d (%v, %d bytes) reported %v, but its destination differs from its source", after, i, p.Op, p.Local.Len, r.Status)
			}
		}
	}
	first, second := len(submits[0]), len(submits[0])+len(submits[1])
	if err := batch.Submit(reqs[:first]); err != nil {
		t.Fatalf("Submit 1 = %v", err)
	}
	if done, err := batch.Poll(); err != nil {
		t.Fatalf("Poll after Submit 1 = %v", err)
	} else if done {
		check(first, "Poll reported submit 1 done")
	}
	if err := batch.Submit(reqs[first:second]); err != nil {
		t.Fatalf("Submit 2 = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := batch.Wait(ctx); err != nil {
		t.Fatalf("Wait after Submit 2 = %v", err)
	}
	check(second, "Wait after submits 1 and 2")
	if err := batch.Submit(reqs[second:]); err != nil {
		t.Fatalf("Submit 3 = %v", err)
	}
	if got := batch.Len(); got != len(reqs) {
		t.Errorf("Len after 3 Submits = %d, want %d", got, len(reqs))
	}
	ended, stop := context.WithCancel(context.Background())
	stop()
	if err := batch.Wait(ended); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Wait with an ended context = %v, want nil or context.Canceled", err)
	}
	pollDone(t, batch, "submit 3")
	check(len(reqs), "Poll reported submit 3 done")
	if err := batch.Wait(ctx); err != nil {
		t.Errorf("Wait after Poll reported done = %v", err)
	}
	if err := batch.Release(); err != nil {
		t.Fatalf("Release = %v", err)
	}
	if !bytes.Equal(ar.Bytes(), wantA) {
		t.Errorf("the local memory after the batch differs from the expected bytes: a request moved bytes it was not asked to")
	}
	if !bytes.Equal(br.Bytes(), wantB) {
		t.Errorf("the peer's memory after the batch differs from the expected bytes: a request moved bytes it was not asked to")
	}
	checkGuards(t, "local", am, 0x13)
	checkGuards(t, "peer", bm, 0x24)
}

// busy checks Release and Unregister right after a Submit of 32 MiB of
// reads, while the requests are likely pending: each either refuses with
// ErrBusy and changes nothing, or returns nil only if every request is
// final (Result, Poll), and the memory is settled from then on.
func (s *suite) busy(t testing.TB) {
	a, b := s.open(t)
	const n, size, k = regionSize, 4 << 20, 8
	am, ar := s.guarded(t, a, n, 0x77)
	_, br := s.guarded(t, b, n, 0x88)
	fillPattern(br.Bytes(), 6)
	seg := openSeg(t, a, b.Segment())
	reqs := make([]rdma.Request, k)
	for i := range reqs {
		l, _ := ar.Sub(i*size, size)
		reqs[i] = rdma.Request{Op: rdma.Read, Local: l, Segment: seg, Remote: br.Addr + uintptr(i*size)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	// final checks the batch after a call said no request is pending;
	// bytes of completed requests are in place.
	final := func(batch rdma.Batch, call string) {
		t.Helper()
		for i := range reqs {
			r := batch.Result(i)
			if !r.Status.Final() {
				t.Errorf("%s returned nil while request %d (%d bytes) is %v: it must return ErrBusy while a request is not final", call, i, size, r.Status)
				continue
			}
			checkBytes(t, fmt.Sprintf("after %s: request %d", call, i), reqs[i], r)
			if r.Status == rdma.Completed && !bytes.Equal(ar.Bytes()[i*size:(i+1)*size], br.Bytes()[i*size:(i+1)*size]) {
				t.Errorf("after %s: request %d completed, but its block differs from the peer's", call, i)
			}
		}
		if done, err := batch.Poll(); !done || err != nil {
			t.Errorf("Poll after %s returned nil = %v, %v, want true, nil: it must return ErrBusy while a request is not final", call, done, err)
		}
	}
	var settled [][]byte // what the local memory held when a call said it was free
	var outcomes []string

	// Release right after Submit.
	batch, err := a.NewBatch(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit(reqs); err != nil {
		t.Fatalf("Submit = %v", err)
	}
	switch err := batch.Release(); {
	case errors.Is(err, rdma.ErrBusy):
		outcomes = append(outcomes, "Release busy")
		if err := batch.Wait(ctx); err != nil {
			t.Fatalf("Wait after Release = ErrBusy: %v", err)
		}
		final(batch, "Wait after Release = ErrBusy")
		if err := batch.Release(); err != nil {
			t.Errorf("Release after Wait = %v, want nil", err)
		}
	case err == nil:
		outcomes = append(outcomes, "Release nil")
		final(batch, "Release")
		settled = append(settled, bytes.Clone(ar.Bytes()))
		if err := batch.Wait(ctx); err != nil {
			t.Errorf("Wait after Release returned nil = %v, want nil (done)", err)
		}
	default:
		t.Fatalf("Release right after Submit = %v, want nil or ErrBusy", err)
	}

	if len(settled) > 0 && !bytes.Equal(settled[0], ar.Bytes()) {
		t.Errorf("the local memory changed after Release returned nil: a request was still moving bytes")
	}
	settled = nil

	// Unregister right after Submit.
	clear(ar.Bytes())
	batch, err = a.NewBatch(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit(reqs); err != nil {
		t.Fatalf("Submit = %v", err)
	}
	switch err := a.Unregister(ar); {
	case errors.Is(err, rdma.ErrBusy):
		outcomes = append(outcomes, "Unregister busy")
		if err := batch.Wait(ctx); err != nil {
			t.Fatalf("Wait after Unregister = ErrBusy: %v", err)
		}
		final(batch, "Wait after Unregister = ErrBusy")
		if err := batch.Release(); err != nil {
			t.Errorf("Release after Wait = %v, want nil", err)
		}
		if err := a.Unregister(ar); err != nil {
			t.Errorf("Unregister after Wait = %v, want nil: a refused Unregister changes nothing", err)
		}
	case err == nil:
		outcomes = append(outcomes, "Unregister nil")
		final(batch, "Unregister")
		settled = append(settled, bytes.Clone(ar.Bytes()))
		if err := batch.Wait(ctx); err != nil {
			t.Errorf("Wait after Unregister returned nil = %v, want nil (done)", err)
		}
		if err := batch.Release(); err != nil {
			t.Errorf("Release after Unregister returned nil = %v, want nil", err)
		}
	default:
		t.Fatalf("Unregister right after Submit = %v, want nil or ErrBusy", err)
	}
	// Nothing moves into memory a call said was free, up to the engines'
	// close, which waits for every running transfer.
	for _, e := range []rdma.Engine{a, b} {
		if err := e.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	}
	if len(settled) > 0 && !bytes.Equal(settled[len(settled)-1], ar.Bytes()) {
		t.Errorf("the local memory changed after %s returned nil: a request was still moving bytes", outcomes[len(outcomes)-1])
	}
	checkGuards(t, "local", am, 0x77)
	t.Logf("busy: %v", outcomes)
}

// closedSegment checks CloseSegment right after a Submit of 32 MiB of reads
// from the segment: the requests already submitted run to their end, with
// every byte in place; the handle is then unknown to Submit, which moves
// nothing; and Open of the name again gives a handle that works.
func (s *suite) closedSegment(t testing.TB) {
	a, b := s.open(t)
	const n, size, k = regionSize, 4 << 20, 8
	am, ar := s.guarded(t, a, n, 0x35)
	bm, br := s.guarded(t, b, n, 0x46)
	fillPattern(br.Bytes(), 8)
	want := bytes.Clone(br.Bytes())
	seg := openSeg(t, a, b.Segment())
	reqs := make([]rdma.Request, k)
	for i := range reqs {
		l, _ := ar.Sub(i*size, size)
		reqs[i] = rdma.Request{Op: rdma.Read, Local: l, Segment: seg, Remote: br.Addr + uintptr(i*size)}
	}
	batch, err := a.NewBatch(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Submit(reqs); err != nil {
		t.Fatalf("Submit = %v", err)
	}
	if err := a.CloseSegment(seg); err != nil {
		t.Fatalf("CloseSegment with %d requests submitted = %v, want nil", k, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := batch.Wait(ctx); err != nil {
		t.Fatalf("Wait after CloseSegment = %v", err)
	}
	for i, req := range reqs {
		r := batch.Result(i)
		checkBytes(t, fmt.Sprintf("request %d, submitted before CloseSegment", i), req, r)
		switch {
		case r.Status != rdma.Completed:
			t.Errorf("request %d (%d bytes), submitted before CloseSegment, ended %+v: requests already submitted to a handle run to their end", i, size, r)
		case !bytes.Equal(ar.Bytes()[i*size:(i+1)*size], want[i*size:(i+1)*size]):
			t.Errorf("request %d, submitted before CloseSegment, completed, but its block differs from the peer's", i)
		}
	}
	if err := batch.Release(); err != nil {
		t.Errorf("Release = %v", err)
	}

	// The handle is forgotten: Submit refuses it and moves nothing.
	clear(ar.Bytes())
	after, err := a.NewBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := ar.Sub(0, size)
	err = after.Submit([]rdma.Request{{Op: rdma.Read, Local: l, Segment: seg, Remote: br.Addr}})
	if !errors.Is(err, rdma.ErrUnknownSegment) {
		t.Errorf("Submit naming a handle CloseSegment forgot = %v, want an error wrapping ErrUnknownSegment", err)
	}
	if got := after.Len(); got != 0 {
		t.Errorf("Len after a refused Submit = %d, want 0", got)
	}
	if err == nil {
		if err := after.Wait(ctx); err != nil {
			t.Errorf("Wait = %v", err)
		}
	}
	if err := after.Release(); err != nil {
		t.Errorf("Release = %v", err)
	}
	if !bytes.Equal(ar.Bytes()[:size], make([]byte, size)) {
		t.Errorf("a request naming a forgotten handle moved bytes")
	}
	if err := a.CloseSegment(seg); !errors.Is(err, rdma.ErrUnknownSegment) {
		t.Errorf("CloseSegment of a handle already closed = %v, want an error wrapping ErrUnknownSegment", err)
	}

	// Open again: a handle that works.
	again := openSeg(t, a, b.Segment())
	req := rdma.Request{Op: rdma.Read, Local: l, Segment: again, Remote: br.Addr + uintptr(size)}
	rb, err := a.NewBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := rb.Submit([]rdma.Request{req}); err != nil {
		t.Errorf("a read through the handle of a second Open of the name: Submit = %v: Open after CloseSegment gives a handle that works", err)
	} else {
		if err := rb.Wait(ctx); err != nil {
			t.Fatalf("Wait = %v", err)
		}
		if r := rb.Result(0); r.Status != rdma.Completed || !bytes.Equal(ar.Bytes()[:size], want[size:2*size]) {
			t.Errorf("a read through the handle of a second Open of the name = %+v, or its bytes differ: want completed, the peer's bytes", r)
		}
	}
	if err := rb.Release(); err != nil {
		t.Errorf("Release = %v", err)
	}
	checkGuards(t, "local", am, 0x35)
	checkGuards(t, "peer", bm, 0x46)
}
