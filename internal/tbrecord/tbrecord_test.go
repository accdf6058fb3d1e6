package tbrecord

import "testing"

// TestRecorder checks the recorder itself: failures propagate to parents,
// FailNow ends only its subtest, cleanups run.
func TestRecorder(t *testing.T) {
	r := New(t, "R")
	var after, cleaned bool
	ok := r.Run("a", func(t *Recorder) {
		t.Cleanup(func() { cleaned = true })
		t.Fatal("boom")
		after = true
	})
	okB := r.Run("b", func(t *Recorder) { t.Log("fine") })
	switch {
	case ok || !okB:
		t.Errorf("run results = %v, %v; want false, true", ok, okB)
	case after:
		t.Error("code after Fatal ran")
	case !cleaned:
		t.Error("cleanup did not run")
	case !r.Failed():
		t.Error("a failed subtest did not fail its parent")
	}
	if got := r.Recording().FailedUnder(""); len(got) != 1 || got[0] != "R/a" {
		t.Errorf("failed tests = %q, want [R/a]", got)
	}
}
