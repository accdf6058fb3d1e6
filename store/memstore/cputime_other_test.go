//go:build !linux

package memstore_test

import "time"

var epoch = time.Now()

// threadCPU returns the wall time since the test binary started: elsewhere
// than on Linux the benchmark's CPU-time figures are wall-clock ones.
func threadCPU() time.Duration { return time.Since(epoch) }
