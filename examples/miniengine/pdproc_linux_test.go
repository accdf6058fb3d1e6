package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// memfds returns how many memory files (rdma/shm's memory) this process
// has open.
func memfds(t *testing.T) int {
	t.Helper()
	fds, err := filepath.Glob("/proc/self/fd/*")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && strings.HasPrefix(l, "/memfd:") {
			n++
		}
	}
	return n
}

// checkGone fails unless the instance processes of r have ended and been
// reaped: their memory, KV and mailboxes (memory files), is gone with
// them, and this process holds none of it.
func checkGone(t *testing.T, r Run, memfdsBefore int) {
	t.Helper()
	for role, pid := range map[string]int{rolePrefill: r.pd.prefillPID, roleDecode: r.pd.decodePID} {
		if pid == 0 {
			t.Errorf("the %s instance never said hello", role)
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the %s instance (pid %d) is still there after the run: /proc/%d: %v", role, pid, pid, err)
		}
	}
	if n := memfds(t); n != memfdsBefore {
		t.Errorf("this process has %d memory files open after the run, %d before", n, memfdsBefore)
	}
}

// TestPrefillDecodeProcs: -pd across processes over shm, through Main:
// the prefill and decode instances are processes of their own, the
// decode instance loads every request's KV from the prefill instance and
// generates exactly what one instance does, and both end cleanly.
func TestPrefillDecodeProcs(t *testing.T) {
	o := small(t)
	before := memfds(t)
	off := mustRun(t, o, false, o.Blocks)
	r, err := runPDProcs(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	mustSame(t, "prefill/decode across processes", off, r.stats)
	if r.BlocksLoaded == 0 || r.LoadBytes == 0 || r.Failed != 0 || r.Failures != 0 {
		t.Errorf("across processes: %d blocks (%d bytes) transferred, %d requests and %d blocks failed; want the prompts' blocks and no failure",
			r.BlocksLoaded, r.LoadBytes, r.Failed, r.Failures)
	}
	if r.Lost != "" || r.Rerouted != 0 || r.pd.decode.Unloaded != 0 {
		t.Errorf("across processes: lost instance %q, %d requests rerouted, %d not loaded; want none", r.Lost, r.Rerouted, r.pd.decode.Unloaded)
	}
	if r.pd.prefill.HeldAtClose != 0 {
		t.Errorf("the prefill instance closed with %d requests kept", r.pd.prefill.HeldAtClose)
	}
	checkGone(t, r, before)

	o.PD = true
	var out, errw bytes.Buffer
	if err := Main(context.Background(), o, &out, &errw); err != nil {
		t.Fatalf("Main -pd: %v\n%s", err, out.String())
	}
	for _, want := range []string{"P/D 1 proc", "P/D 2 procs", "as two processes (shm)", "mean TPOT (ms)", "outputs identical: yes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("Main -pd: report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestPDDecodeKilled: the decode instance is killed (SIGKILL) once a
// request ended, before the next turn is submitted. The coordinator notices its connection end, counts the
// requests it took with it failed, and ends the prefill instance, which
// keeps the blocks of requests handed to the dead instance until
// keep_timeout (1 s here), then closes its engine cleanly (its Close
// returned nil, its exit status is 0) and leaves no memory behind.
func TestPDDecodeKilled(t *testing.T) {
	o := small(t)
	o.pdKeep = time.Second
	before := memfds(t)
	var killErr error
	o.pdOnEnd = func(ended int, prefill, decode *os.Process) {
		if ended == 1 {
			killErr = decode.Kill()
		}
	}
	r, err := runPDProcs(context.Background(), o)
	if killErr != nil {
		t.Fatalf("kill the decode instance: %v", killErr)
	}
	if !errors.Is(err, errInstanceGone) || !strings.Contains(err.Error(), "the decode instance") || strings.Contains(err.Error(), "the prefill instance") {
		t.Fatalf("runPDProcs with the decode instance killed = %v, want errInstanceGone naming the decode instance, and nothing about the prefill instance", err)
	}
	total := o.Workload.Sessions * o.Workload.Turns
	if r.Lost != roleDecode || r.Succeeded < 1 || r.Failed == 0 || r.Succeeded+r.Failed != total {
		t.Errorf("lost %q, %d succeeded, %d failed; want the decode instance lost, the first request succeeded and the other %d failed", r.Lost, r.Succeeded, r.Failed, total-r.Succeeded)
	}
	p := r.pd.prefill
	if p.HeldAtClose != 0 || p.CloseErr != "" {
		t.Errorf("the prefill instance closed with %d requests kept, Close: %q; want none kept and nil", p.HeldAtClose, p.CloseErr)
	}
	t.Logf("the prefill instance kept %d requests when its input ended, and released them", p.HeldAtEnd)
	checkGone(t, r, before)
}

// dead waits, for up to a minute, until process pid has died (it is a
// zombie, or reaped).
func dead(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return // reaped
		}
		// pid (comm) state ...: the state follows the last ')'.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X') {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for the killed process %d to die: /proc/%d/stat says %q", pid, pid, b)
		}
		runtime.Gosched()
	}
}

// TestPDPrefillKilled: the prefill instance is killed (SIGKILL) mid-run.
// The coordinator notices its connection end and tells the decode
// instance, which forgets the producer (p2p Scheduler.Forget): loads from
// it fail and the decode instance computes those requests itself, as it
// does the requests the prefill instance took with it. Every request
// completes with the tokens of one instance, and the decode instance
// ends cleanly.
//
// Killed after a request ended, before the next turn is submitted to it,
// the prefill instance takes that turn with it. Killed as it ended its
// first request, whose transfer parameters reach the decode instance
// once the prefill instance is dead, it leaves that request's KV
// unreachable: its load fails.
func TestPDPrefillKilled(t *testing.T) {
	for _, tc := range []struct {
		name     string
		kill     func(o *Options, kill func(*os.Process))
		rerouted bool // want requests of the prefill instance computed by the decode instance
		unloaded bool // want requests whose KV never arrived
	}{
		{"after a request ended", func(o *Options, kill func(*os.Process)) {
			o.pdOnEnd = func(ended int, prefill, _ *os.Process) {
				if ended == 1 {
					kill(prefill)
				}
			}
		}, true, false},
		{"with parameters on their way", func(o *Options, kill func(*os.Process)) {
			o.pdOnPrefilled = func(n int, prefill *os.Process) {
				if n == 1 {
					kill(prefill)
				}
			}
		}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := small(t)
			before := memfds(t)
			off := mustRun(t, o, false, o.Blocks)
			tc.kill(&o, func(p *os.Process) {
				if err := p.Kill(); err != nil {
					t.Errorf("kill the prefill instance: %v", err)
				}
				dead(t, p.Pid)
			})
			r, err := runPDProcs(context.Background(), o)
			if err != nil {
				t.Fatalf("runPDProcs with the prefill instance killed: %v", err)
			}
			total := o.Workload.Sessions * o.Workload.Turns
			if r.Lost != rolePrefill || r.Succeeded != total || r.Failed != 0 {
				t.Errorf("lost %q, %d succeeded, %d failed; want the prefill instance lost and all %d requests succeeded", r.Lost, r.Succeeded, r.Failed, total)
			}
			mustSame(t, "prefill killed", off, r.stats)
			d := r.pd.decode
			if d.Forgotten != 1 || d.CloseErr != "" {
				t.Errorf("the decode instance forgot %d producers, Close: %q; want 1 and nil", d.Forgotten, d.CloseErr)
			}
			if tc.rerouted && r.Rerouted == 0 {
				t.Errorf("no request of the prefill instance was computed by the decode instance; want at least the turn submitted after the kill")
			}
			if tc.unloaded && d.Unloaded == 0 {
				t.Errorf("every request with transfer parameters loaded; want the first one's load, from the dead prefill instance, to fail")
			}
			t.Logf("the decode instance computed %d requests sent to the prefill instance, and %d whose KV never arrived", r.Rerouted, d.Unloaded)
			checkGone(t, r, before)
		})
	}
}
