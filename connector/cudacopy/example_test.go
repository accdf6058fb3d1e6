package cudacopy_test

import (
	"fmt"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/cudacopy"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/cudart"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// A GPU worker's KV memory is device memory: the worker half stages it
// through pinned host memory with a Copier on the worker's device. The
// worker closes before its KV memory is freed, and the Copier after both.
func ExampleNew() {
	rt, err := cudart.Open()
	if err != nil { // cudart.ErrUnavailable, or ErrUnsupported off Linux
		fmt.Println("no CUDA runtime: keep the KV cache in host memory:", err)
		return
	}
	dev, err := rt.Device(0)
	if err != nil {
		fmt.Println(err) // cudart.IsNoGPU(err): a runtime but no GPU
		return
	}
	cp, err := cudacopy.New(dev)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cp.Close()

	gpu, err := dev.Malloc(64 << 20) // the paged KV memory
	if err != nil {
		fmt.Println(err)
		return
	}
	defer gpu.Free()

	var (
		id hashing.Identity // the engine's model and layout
		st store.Store      // the embedded store, say
	)
	w, err := connector.OpenWorker(connector.Config{Connector: storeconn.Name},
		connector.Env{Identity: id, Store: st, Copier: cp})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Close()

	kv := connector.KVCache{Layers: 2, Blocks: 64, KV: 2, BlockBytes: 256 << 10, Order: connector.LayerMajor,
		Regions: []rdma.Region{{Addr: gpu.Addr(), Len: gpu.Len(), Loc: rdma.Device(dev.Ordinal())}}}
	if err := w.Register(kv); err != nil {
		fmt.Println(err)
		return
	}
	// ... the engine's loop: Start, Save, Poll (see connector's Example).
}
