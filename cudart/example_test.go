package cudart_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvconnect/kvconnect/cudart"
)

func ExampleCode() {
	fmt.Println(cudart.NotReady, int32(cudart.NotReady))
	fmt.Println(cudart.InsufficientDriver)
	fmt.Println(cudart.Code(916))
	// Output:
	// cudaErrorNotReady 600
	// cudaErrorInsufficientDriver
	// cudaError(916)
}

func ExampleIsNoGPU() {
	err := fmt.Errorf("start worker: %w", &cudart.Error{Op: "cudaGetDeviceCount", Code: cudart.InsufficientDriver})
	fmt.Println(cudart.IsNoGPU(err), cudart.IsNoDriver(err), cudart.IsNoDevice(err))
	var e *cudart.Error
	if errors.As(err, &e) {
		fmt.Println(e.Op, e.Code)
	}
	// Output:
	// true true false
	// cudaGetDeviceCount cudaErrorInsufficientDriver
}

// Packages that must not import cudart declare the small interfaces they
// need with unnamed types; *Stream and *Event satisfy them.
func Example_interfaces() {
	type blockCopy = struct {
		Dst, Src uintptr
		N        int
	}
	type copier interface {
		CopyToDevice([]blockCopy) error
		CopyToHost([]blockCopy) error
		Synchronize(context.Context) error
	}
	type readyEvent interface {
		Query() (bool, error)
	}
	var (
		_ copier     = (*cudart.Stream)(nil)
		_ readyEvent = (*cudart.Event)(nil)
	)
	fmt.Println("ok")
	// Output: ok
}

func ExampleOpen() {
	rt, err := cudart.Open()
	if errors.Is(err, cudart.ErrUnavailable) {
		fmt.Println("no CUDA runtime: stay on the CPU")
		return
	}
	dev, err := rt.Device(0)
	if cudart.IsNoGPU(err) {
		fmt.Println("CUDA runtime without a usable GPU:", err)
		return
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("using device", dev.Ordinal(), "with", rt.BatchCopy())
}
