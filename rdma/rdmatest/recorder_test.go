package rdmatest

import (
	"testing"

	"github.com/kvconnect/kvconnect/internal/tbrecord"
)

// recorder is a tester that records failures instead of failing the test
// it runs in (internal/tbrecord), so that the harness can be run against
// broken engines.
type recorder struct{ *tbrecord.Recorder }

func newRecorder(t testing.TB, name string) recorder { return recorder{tbrecord.New(t, name)} }

func (r recorder) run(name string, f func(t testing.TB)) bool {
	return r.Recorder.Run(name, func(c *tbrecord.Recorder) { f(c) })
}

// runRecorded runs the harness on the pairs open returns, under a
// recorder, and returns what it recorded. With only, it runs only the
// subtest of that name.
func runRecorded(t *testing.T, open PairFunc, opts Options, only string) *tbrecord.Recording {
	r := newRecorder(t, "Run")
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer r.RunCleanups()
		run(r, open, opts, only)
	}()
	<-done
	return r.Recording()
}
