// Package cudacopy is the CUDA side of a connector's device staging: a
// [Copier] over CUDA streams of one device that is a
// [connector.DeviceCopier] and a [connector.HostPinner]. It is for GPU
// engines whose KV memory is device memory; CPU-only users never import
// it.
//
// It is the one package that imports both connector and cudart, so that
// neither imports the other: connector stays free of CUDA and its
// [connector.DeviceCopy] is a struct of its own that can grow fields,
// while cudart stays a plain binding of the runtime, with its own
// [cudart.Copy]. A Copier turns one into the other, batch by batch.
//
// # Usage
//
//	rt, err := cudart.Open()
//	dev, err := rt.Device(0)
//	cp, err := cudacopy.New(dev)
//	w, err := connector.OpenWorker(cfg, connector.Env{
//		Identity: id, Rank: rank,
//		Copier:   cp, // stages device KV through pinned host memory
//	})
//	...
//	err = w.Close() // until it returns nil
//	err = cp.Close()
//
// # Streams
//
// Each batch of copies runs on a CUDA stream that holds no other work:
// an idle stream of the Copier's, or a new one when every stream is busy.
// The batch's [connector.CopyCompletion] synchronizes that stream, so it
// covers exactly the batch's copies, and batches issued concurrently
// (by a worker's transfer goroutines) run on different streams and never
// wait for each other. A stream becomes idle again once Wait of its
// batch's completion has returned nil; after a failed Wait it is never
// used again. A worker with n transfer goroutines thus uses n streams at
// most.
//
// # Concurrency
//
// A Copier's methods other than Close are safe for concurrent use, as are
// its completions' Wait. Close must not overlap any other call on the
// Copier or its completions, and must be the last: close the Copier after
// every worker that uses it has closed.
package cudacopy
