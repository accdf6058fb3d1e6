// Package tbrecord is a testing.TB that records what a test harness
// reports instead of failing the test it runs in: the exported harnesses'
// own tests run them against implementations broken on purpose, and check
// which subtest failed and why.
package tbrecord

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// Recorder is a testing.TB that records failures instead of failing the
// test it runs in, so that a harness can be run against implementations
// broken on purpose. Like
// testing.T, it runs each subtest on its own goroutine and ends it with
// runtime.Goexit on FailNow and SkipNow. Methods it does not override
// (TempDir, Context, ...) go to the enclosing test.
type Recorder struct {
	testing.TB
	name   string
	parent *Recorder
	log    *Recording

	mu       sync.Mutex
	failed   bool
	cleanups []func()
}

// Recording is what a tree of Recorders saw.
type Recording struct {
	mu     sync.Mutex
	lines  []string
	failed map[string]bool // names of the (sub)tests that failed themselves
}

// New returns a Recorder named name whose unrecorded methods (TempDir,
// Context, ...) go to t.
func New(t testing.TB, name string) *Recorder {
	return &Recorder{TB: t, name: name, log: &Recording{failed: map[string]bool{}}}
}

// Recording returns what r and its subtests recorded.
func (r *Recorder) Recording() *Recording { return r.log }

func (r *Recorder) Helper()      {}
func (r *Recorder) Name() string { return r.name }

func (r *Recorder) Logf(format string, args ...any) { r.Log(fmt.Sprintf(format, args...)) }
func (r *Recorder) Log(args ...any) {
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	r.log.lines = append(r.log.lines, r.name+": "+strings.TrimSuffix(fmt.Sprintln(args...), "\n"))
}

func (r *Recorder) Errorf(format string, args ...any) { r.Logf(format, args...); r.Fail() }
func (r *Recorder) Error(args ...any)                 { r.Log(args...); r.Fail() }
func (r *Recorder) Fatalf(format string, args ...any) { r.Logf(format, args...); r.FailNow() }
func (r *Recorder) Fatal(args ...any)                 { r.Log(args...); r.FailNow() }
func (r *Recorder) FailNow()                          { r.Fail(); runtime.Goexit() }
func (r *Recorder) Skipf(format string, args ...any)  { r.Logf(format, args...); r.SkipNow() }
func (r *Recorder) Skip(args ...any)                  { r.Log(args...); r.SkipNow() }
func (r *Recorder) SkipNow()                          { runtime.Goexit() }
func (r *Recorder) Skipped() bool                     { return false }

func (r *Recorder) Fail() {
	r.log.mu.Lock()
	r.log.failed[r.name] = true
	r.log.mu.Unlock()
	for p := r; p != nil; p = p.parent {
		p.mu.Lock()
		p.failed = true
		p.mu.Unlock()
	}
}

func (r *Recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *Recorder) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// Run runs f as a subtest named name on a goroutine of its own, as
// testing.T.Run does, and reports whether it passed.
func (r *Recorder) Run(name string, f func(*Recorder)) bool {
	c := &Recorder{TB: r.TB, name: r.name + "/" + name, parent: r, log: r.log}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.RunCleanups()
		f(c)
	}()
	<-done
	return !c.Failed()
}

// RunCleanups runs the cleanups registered with r, last first.
func (r *Recorder) RunCleanups() {
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

// FailedUnder returns the failed tests whose names start with prefix.
func (g *Recording) FailedUnder(prefix string) []string {
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

// SaidUnder reports whether a test whose name starts with prefix logged a
// line containing text.
func (g *Recording) SaidUnder(prefix, text string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, l := range g.lines {
		if strings.HasPrefix(l, prefix) && strings.Contains(l, text) {
			return true
		}
	}
	return false
}

func (g *Recording) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return strings.Join(g.lines, "\n")
}
