package rdmatest

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// recorder is a tester that records failures instead of failing the test
// it runs in, so that the harness can be run against broken engines. Like
// testing.T, it runs each subtest on its own goroutine and ends it with
// runtime.Goexit on FailNow and SkipNow. Methods it does not override
// (TempDir, Context, ...) go to the enclosing test.
type recorder struct {
	testing.TB
	name   string
	parent *recorder
	log    *recording

	mu       sync.Mutex
	failed   bool
	cleanups []func()
}

// recording is what a tree of recorders saw.
type recording struct {
	mu     sync.Mutex
	lines  []string
	failed map[string]bool // names of the (sub)tests that failed themselves
}

func newRecorder(t testing.TB, name string) *recorder {
	return &recorder{TB: t, name: name, log: &recording{failed: map[string]bool{}}}
}

func (r *recorder) Helper()      {}
func (r *recorder) Name() string { return r.name }

func (r *recorder) Logf(format string, args ...any) { r.Log(fmt.Sprintf(format, args...)) }
func (r *recorder) Log(args ...any) {
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	r.log.lines = append(r.log.lines, r.name+": "+strings.TrimSuffix(fmt.Sprintln(args...), "\n"))
}

func (r *recorder) Errorf(format string, args ...any) { r.Logf(format, args...); r.Fail() }
func (r *recorder) Error(args ...any)                 { r.Log(args...); r.Fail() }
func (r *recorder) Fatalf(format string, args ...any) { r.Logf(format, args...); r.FailNow() }
func (r *recorder) Fatal(args ...any)                 { r.Log(args...); r.FailNow() }
func (r *recorder) FailNow()                          { r.Fail(); runtime.Goexit() }
func (r *recorder) Skipf(format string, args ...any)  { r.Logf(format, args...); r.SkipNow() }
func (r *recorder) Skip(args ...any)                  { r.Log(args...); r.SkipNow() }
func (r *recorder) SkipNow()                          { runtime.Goexit() }
func (r *recorder) Skipped() bool                     { return false }

func (r *recorder) Fail() {
	r.log.mu.Lock()
	r.log.failed[r.name] = true
	r.log.mu.Unlock()
	for p := r; p != nil; p = p.parent {
		p.mu.Lock()
		p.failed = true
		p.mu.Unlock()
	}
}

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

func (r *recorder) run(name string, f func(t testing.TB)) bool {
	c := &recorder{TB: r.TB, name: r.name + "/" + name, parent: r, log: r.log}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.runCleanups()
		f(c)
	}()
	<-done
	return !c.Failed()
}

func (r *recorder) runCleanups() {
	for {
		r.mu.Lock()
		n := len(r.cleanups)
		if n == 0 {
			r.mu.Unlock()
			return
		}
		f := r.cleanups[n-1]
		r.cleanups = r.cleanups[:n-1]
		r.mu.Unlock()
		done := make(chan struct{}) // a cleanup may call FailNow
		go func() {
			defer close(done)
			f()
		}()
		<-done
	}
}

// runRecorded runs the harness on the pairs open returns, under a
// recorder, and returns what it recorded. With only, it runs only the
// subtest of that name.
func runRecorded(t *testing.T, open PairFunc, opts Options, only string) *recording {
	r := newRecorder(t, "Run")
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer r.runCleanups()
		run(r, open, opts, only)
	}()
	<-done
	return r.log
}

// failedUnder returns the failed tests whose names start with prefix.
func (g *recording) failedUnder(prefix string) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for name := range g.failed {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	return out
}

// saidUnder reports whether a test whose name starts with prefix logged a
// line containing text.
func (g *recording) saidUnder(prefix, text string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, l := range g.lines {
		if strings.HasPrefix(l, prefix) && strings.Contains(l, text) {
			return true
		}
	}
	return false
}

func (g *recording) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return strings.Join(g.lines, "\n")
}
