package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
)

// checkRanksGone fails unless every rank process of r has ended and been
// reaped, and the run's socket folder is gone.
func checkRanksGone(t *testing.T, r Run, tmp string) {
	t.Helper()
	if r.tp == nil || len(r.tp.pids) == 0 {
		t.Fatal("the run started no rank process")
	}
	for _, pid := range r.tp.pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("rank process %d is still there after the run: %v", pid, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "miniengine-tp-*")); len(left) > 0 {
		t.Errorf("the run left %v behind", left)
	}
}

// TestTPProcs: -tp 2 -tp-procs through Main: the ranks run as processes
// of their own, load and save through the store served on a socket, and
// generate what the ranks in one process do.
func TestTPProcs(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	o := small(t)
	o.TP, o.TPProcs = 2, true
	o.JSON = true
	var out, errw bytes.Buffer
	if err := Main(context.Background(), o, &out, &errw); err != nil {
		t.Fatalf("Main: %v\n%s\n%s", err, out.String(), errw.String())
	}
	var res struct {
		Runs      []Run `json:"runs"`
		TP        *Run  `json:"tp_processes"`
		Identical bool  `json:"outputs_identical"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.TP == nil || !res.Identical {
		t.Fatalf("-json: %v, identical %v, tp_processes %+v:\n%s", err, res.Identical, res.TP, out.String())
	}
	if r := res.TP; r.Failed != 0 || r.BlocksLoaded == 0 || r.BlocksSaved == 0 || r.RanksLost != 0 {
		t.Errorf("ranks as processes: %d failed, %d blocks loaded, %d saved, %d ranks lost; want 0, > 0, > 0, 0", r.Failed, r.BlocksLoaded, r.BlocksSaved, r.RanksLost)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "miniengine-tp-*")); len(left) > 0 {
		t.Errorf("the run left %v behind", left)
	}
	o.JSON = false
	out.Reset()
	if err := Main(context.Background(), o, &out, &errw); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"as 2 processes", "outputs identical: yes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
}

// runKilled runs the workload with the ranks as processes, where one is
// lost mid-run, and checks that the run ended with every block back: a
// transfer of the lost rank left unreported would hold its blocks, and
// the run would never end (the bound names it). With owed, the lost rank
// must have owed transfers, which the ledger wrote off.
func runKilled(t *testing.T, o Options, owed bool) Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := runTPProcs(ctx, o, o.PressureBlocks)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the run did not end within 5m of its start, with a rank lost: requests stranded (%v)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.tp.held != 0 || r.tp.used != 0 {
		t.Errorf("the run ended with %d requests held and %d blocks in use", r.tp.held, r.tp.used)
	}
	if owed && r.tp.xfers == 0 {
		t.Errorf("the lost rank owed no transfer: the loss tested nothing of the ledger (%v)", r.tp.lost)
	}
	return r
}

// TestTPRankKilled kills a rank process with SIGKILL mid-run: the step it
// had is abandoned, a new process takes its place, every request
// recomputes what it lost, and the run generates exactly what it does
// without a connector, with no request failed and no process left.
func TestTPRankKilled(t *testing.T) {
	for _, victim := range []int{0, 1} {
		t.Run(fmt.Sprintf("rank%d", victim), func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			o := small(t)
			o.TP = 2
			want := mustRun(t, o, false, o.PressureBlocks)
			var once sync.Once
			var killed int
			o.tpOnStep = func(m *connector.Metadata, ranks []*os.Process) {
				if m == nil || m.Step < 8 || len(m.Loads)+len(m.Saves) == 0 {
					return // a step that hands the victim transfers it will never report
				}
				once.Do(func() {
					killed = ranks[victim].Pid
					if err := ranks[victim].Signal(syscall.SIGKILL); err != nil {
						t.Errorf("kill rank %d: %v", victim, err)
					}
				})
			}
			r := runKilled(t, o, true)
			if killed == 0 {
				t.Fatal("the run ended before step 8: nothing was killed")
			}
			mustSame(t, "a rank killed", want, r.stats)
			if r.Failed != 0 || r.Succeeded != o.Workload.Sessions*o.Workload.Turns {
				t.Errorf("%d succeeded, %d failed; want every request to succeed", r.Succeeded, r.Failed)
			}
			if r.RanksLost != 1 || r.tp.steps != 1 || len(r.tp.pids) != 3 {
				t.Errorf("%d ranks lost, %d steps abandoned, %d processes started; want 1, 1, 3 (%v)", r.RanksLost, r.tp.steps, len(r.tp.pids), r.tp.lost)
			}
			if len(r.tp.lost) > 0 && !strings.Contains(r.tp.lost[0], fmt.Sprintf("rank %d (pid %d)", victim, killed)) {
				t.Errorf("the loss is described as %q, want it to name rank %d (pid %d)", r.tp.lost[0], victim, killed)
			}
			t.Logf("lost: %v; %d transfers written off, %d blocks loaded", r.tp.lost, r.tp.xfers, r.BlocksLoaded)
			checkRanksGone(t, r, tmp)
		})
	}
}

// TestTPRankDies has rank 1's first process exit at each point of the
// step protocol in turn (tpConfig.DieAt), and rank 0's at some: the
// scheduler must keep every survivor's stream in step, whatever it was
// sending or waiting for, and the run must end as TestTPRankKilled's.
func TestTPRankDies(t *testing.T) {
	o := small(t)
	o.TP = 2
	want := mustRun(t, o, false, o.PressureBlocks)
	for _, c := range []struct {
		rank int
		at   string
	}{
		{1, "8:step"}, {1, "8:part0"}, {1, "8:sum0"}, {1, "8:part1"}, {1, "8:sum1"}, {1, "8:end"}, {1, "8:done"},
		{0, "8:part0"}, {0, "8:sum1"}, {0, "8:done"},
	} {
		t.Run(fmt.Sprintf("rank%d-%s", c.rank, strings.ReplaceAll(c.at, ":", "-")), func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			o := o
			o.tpDie.rank, o.tpDie.at = c.rank, c.at
			// A rank that dies once its done is sent owes the step's
			// transfers only if they had not ended by then.
			r := runKilled(t, o, !strings.HasSuffix(c.at, ":done"))
			mustSame(t, "a rank died at "+c.at, want, r.stats)
			if r.Failed != 0 || r.RanksLost != 1 || len(r.tp.pids) != 3 {
				t.Errorf("%d failed, %d ranks lost, %d processes started; want 0, 1, 3 (%v)", r.Failed, r.RanksLost, len(r.tp.pids), r.tp.lost)
			}
			if len(r.tp.lost) > 0 && !strings.Contains(r.tp.lost[0], "exit status 3") {
				t.Errorf("the loss is described as %q, want the exit status the order gave", r.tp.lost[0])
			}
			checkRanksGone(t, r, tmp)
		})
	}
}

// TestTPRestartFails: a rank is killed and its new process cannot reach
// the store (its socket is gone), so it exits before it connects. The run
// must end with an error naming the restart, no panic, and no process
// left.
func TestTPRestartFails(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	o := small(t)
	o.TP = 2
	var once sync.Once
	var pids []int
	o.tpOnStep = func(m *connector.Metadata, ranks []*os.Process) {
		if m == nil || m.Step < 8 {
			return
		}
		once.Do(func() {
			socks, err := filepath.Glob(filepath.Join(tmp, "miniengine-tp-*", "store.sock"))
			if err != nil || len(socks) != 1 {
				t.Errorf("the store's socket: %v, %v", socks, err)
			}
			for _, s := range socks {
				os.Remove(s)
			}
			for _, p := range ranks {
				pids = append(pids, p.Pid)
			}
			ranks[1].Signal(syscall.SIGKILL)
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := runTPProcs(ctx, o, o.PressureBlocks)
	if !errors.Is(err, errRankRestart) || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("runTPProcs = %v, want an error wrapping errRankRestart naming rank 1", err)
	}
	t.Logf("%v", err)
	if len(pids) == 0 {
		t.Fatal("nothing was killed")
	}
	checkRanksGone(t, r, tmp)
}
