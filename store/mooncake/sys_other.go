//go:build !linux

package mooncake

// The binding runs on Linux only; elsewhere Open fails with errUnsupported
// and nothing below is reached.

func load(string) (*api, error) { return nil, errUnsupported }

func mapMem(int) ([]byte, error) { return nil, errUnsupported }

func unmapMem([]byte) {}

func onNativeThread(fn func()) { fn() }

func unblockSignals() error { return errUnsupported }
