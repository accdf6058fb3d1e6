//go:build unix && !linux

package rdma

// advise does nothing: transparent huge pages are Linux's.
func advise([]byte) {}
