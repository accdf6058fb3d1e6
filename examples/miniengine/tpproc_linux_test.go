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
			o.tpOnStep = func(step uint64, ranks []*os.Process) {
				if step < 8 {
					return
				}
				once.Do(func() {
					killed = ranks[victim].Pid
					if err := ranks[victim].Signal(syscall.SIGKILL); err != nil {
						t.Errorf("kill rank %d: %v", victim, err)
					}
				})
			}
			r, err := runTPProcs(context.Background(), o, o.PressureBlocks)
			if err != nil {
				t.Fatal(err)
			}
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
			t.Logf("lost: %v; %d blocks loaded", r.tp.lost, r.BlocksLoaded)
			checkRanksGone(t, r, tmp)
		})
	}
}
