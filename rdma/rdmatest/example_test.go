package rdmatest_test

import (
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/rdmatest"
)

// An engine's conformance test: two loopback engines on one fabric, closed
// at the end of each subtest.
func ExampleRun() {
	testConformance := func(t *testing.T) {
		rdmatest.Run(t, func(t testing.TB) (rdma.Engine, rdma.Engine) {
			f := rdma.NewFabric()
			var es [2]rdma.Engine
			for i, name := range []string{"prefill", "decode"} {
				e, err := f.NewEngine(name, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := e.Close(); err != nil {
						t.Error(err)
					}
				})
				es[i] = e
			}
			return es[0], es[1]
		}, rdmatest.Options{})
	}
	_ = testConformance // in a _test.go file: func TestConformance(t *testing.T) { ... }
}
