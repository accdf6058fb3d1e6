//go:build linux

package cudart

import (
	"fmt"
	"os"

	"github.com/kvconnect/kvconnect/internal/dl"
)

// Open loads the CUDA runtime library: the file or folder named by
// CUDART_PATH if set, else libcudart.so.13, .so.12 and .so.11.0 through
// the dynamic linker's search path, then in $CUDA_HOME/lib64,
// $CUDA_HOME/lib and /usr/local/cuda. It resolves every required symbol
// (a missing one is an error naming it), records optional ones that are
// absent (cudaMemcpyBatchAsync before 12.8). It makes no call into the
// library: the runtime and driver versions are read at the first call that
// needs them ([Runtime.RuntimeVersion], [Runtime.BatchCopy], a batch copy),
// since the first such call loads and initializes the driver, which takes
// longer than loading the runtime.
//
// Every error wraps [ErrUnavailable]. Open succeeds on a machine with the
// library but no driver or no GPU: [Runtime.DeviceCount] then reports
// why. Each call loads anew (dlopen counts references), so callers keep
// the Runtime.
func Open() (*Runtime, error) {
	lib, err := dl.Open(search(os.Getenv(HomeVar)))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	t := new(table)
	absent, err := lib.BindAll(t.symbols())
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, lib.Path(), err)
	}
	if err := lib.Bind(&t.memcpyBatchAsync9, batchSymbol); err == nil {
		// Same symbol, the other prototype: newRuntime calls only the one
		// that matches the runtime version.
		if err := lib.Bind(&t.memcpyBatchAsync8, batchSymbol); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, lib.Path(), err)
		}
	} else {
		absent = append(absent, batchSymbol)
	}
	return newRuntime(t, lib.Path(), lib.RealPath(), absent), nil
}
