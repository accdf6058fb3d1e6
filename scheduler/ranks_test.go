package scheduler

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestRankLost is an engine of two tensor-parallel ranks that opened and
// polls the worker of rank 0 only. Without a bound, the first request that
// saves stays held for ever (the transfer waits for rank 1's Output);
// with one, Done returns an error naming rank 1 after RankSteps steps of
// its silence, the transfers rank 1 owed are written off, and once every
// request has ended no block is held or used.
func TestRankLost(t *testing.T) {
	st := e2eStore(t)
	const bound = 20
	cfg := Config{Identity: e2eIdentity(4), Blocks: 96, MaxBatchedTokens: 48, PrefixCaching: true, RankSteps: bound}
	e := newMiniEngine(t, st, cfg)
	e.workers = e.workers[:1] // rank 1's worker is never polled
	workload(e, "q")
	deadline := time.Now().Add(2 * time.Minute)
	var lost []*RankLostError
	for {
		st := e.s.Stats()
		if st.Waiting+st.Loading+st.Running == 0 && st.Held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 2m for every request to end and no block to be held: %+v, %d losses", st, len(lost))
		}
		_, err := e.step()
		var rl *RankLostError
		switch {
		case errors.As(err, &rl):
			if !errors.Is(err, ErrRankLost) {
				t.Errorf("%v does not match ErrRankLost", err)
			}
			if rl.Rank != 1 || rl.Steps < bound || rl.Transfers == 0 || rl.LastStep != 0 {
				t.Errorf("RankLostError = %+v, want rank 1, >= %d steps, some transfers, no Output ever", *rl, bound)
			}
			if !strings.Contains(err.Error(), "rank 1 lost") {
				t.Errorf("error %q does not name rank 1", err)
			}
			lost = append(lost, rl)
		case err != nil:
			t.Fatal(err)
		}
	}
	if len(lost) == 0 {
		t.Fatal("every request ended with no rank lost: rank 1 owed nothing, the test tests nothing")
	}
	if st := e.s.Stats(); st.Pool.Used != 0 {
		t.Errorf("%d blocks used after every request ended and nothing is held", st.Pool.Used)
	}
	t.Logf("rank 1 lost %d times; first: %v", len(lost), lost[0])
}

// TestRankLostNotIdle: a scheduler whose rank owes transfers and missed
// the last Done is not Idle, so an engine that waits steps on toward the
// bound instead of blocking for ever.
func TestRankLostNotIdle(t *testing.T) {
	st := e2eStore(t)
	cfg := Config{Identity: e2eIdentity(4), Blocks: 96, MaxBatchedTokens: 48, PrefixCaching: true, RankSteps: 1 << 20}
	e := newMiniEngine(t, st, cfg)
	e.workers = e.workers[:1]
	e.add("r", seq(0, 20), 1)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := e.step(); err != nil {
			t.Fatal(err)
		}
		if st := e.s.Stats(); st.Waiting+st.Loading+st.Running == 0 && st.Held > 0 {
			break // only rank 1's report keeps the blocks
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 2m for the request to end with its blocks held: %+v", e.s.Stats())
		}
	}
	// A step with nothing in it and no news since: idle, but for rank 1.
	for range 2 {
		if _, err := e.step(); err != nil {
			t.Fatal(err)
		}
	}
	if e.s.Stats().Held == 0 {
		t.Fatal("the blocks were released without rank 1's Output")
	}
	if e.s.Idle() {
		t.Error("Idle() = true while rank 1 owes transfers and sent nothing: an engine that waits would block for ever")
	}
}

func TestConfigRankSteps(t *testing.T) {
	cfg := testConfig(16, 4, 64)
	cfg.RankSteps = -1
	err := cfg.Validate()
	if !errors.Is(err, ErrConfig) || err == nil || !strings.Contains(err.Error(), "RankSteps = -1") {
		t.Errorf("Validate(RankSteps -1) = %v, want ErrConfig naming RankSteps = -1", err)
	}
}
