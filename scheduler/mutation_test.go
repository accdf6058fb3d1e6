package scheduler

import (
	"flag"
	"fmt"
	"testing"

	"pgregory.net/rapid"
)

// failTB is a rapid.TB that records a failure instead of failing the test.
type failTB struct {
	*testing.T
	failed bool
	msg    string
}

type stopped struct{}

func (f *failTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
	panic(stopped{})
}
func (f *failTB) Fatal(args ...any) { f.failed, f.msg = true, fmt.Sprint(args...); panic(stopped{}) }
func (f *failTB) Errorf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
}
func (f *failTB) Error(args ...any)   { f.failed, f.msg = true, fmt.Sprint(args...) }
func (f *failTB) FailNow()            { f.failed = true; panic(stopped{}) }
func (f *failTB) Fail()               { f.failed = true }
func (f *failTB) Failed() bool        { return f.failed }
func (f *failTB) Logf(string, ...any) {}
func (f *failTB) Log(...any)          {}

func setFlag(t *testing.T, name, value string) {
	t.Helper()
	f := flag.Lookup(name)
	old := f.Value.String()
	if err := f.Value.Set(value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Value.Set(old); err != nil {
			t.Error(err)
		}
	})
}

// TestStateMachineCatchesMutants proves the state machine test able to
// fail: each deliberate bug (the engine-side bugs a connector integration
// is known for among them) must make it fail.
func TestStateMachineCatchesMutants(t *testing.T) {
	setFlag(t, "rapid.nofailfile", "true")
	setFlag(t, "rapid.shrinktime", "50ms")
	setFlag(t, "rapid.checks", "1000")
	for mut := mutNone + 1; mut < mutCount; mut++ {
		t.Run(mut.String(), func(t *testing.T) {
			ft := &failTB{T: t}
			func() {
				defer func() {
					if r := recover(); r != nil {
						if _, ok := r.(stopped); !ok {
							panic(r)
						}
					}
				}()
				rapid.Check(ft, func(rt *rapid.T) { runMutant(rt, mut) })
			}()
			if !ft.failed {
				t.Fatalf("the state machine test passed with the bug %v switched on", mut)
			}
			t.Logf("caught: %.200s", ft.msg)
		})
	}
}
