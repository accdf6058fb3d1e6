//go:build !linux

package shm

import (
	"context"
	"fmt"
	"runtime"

	"github.com/kvconnect/kvconnect/rdma"
)

// Engine is a shared-memory transfer engine; it works on Linux only.
// Elsewhere [New] returns an error wrapping [ErrUnsupported] and every
// method of an Engine does too.
type Engine struct{}

var _ rdma.Engine = (*Engine)(nil)

func unsupported(op string) error {
	return fmt.Errorf("shm: %s on %s: %w (Linux only)", op, runtime.GOOS, ErrUnsupported)
}

// New returns an error wrapping [ErrUnsupported]: shared-memory engines
// need Linux.
func New(opts *Options) (*Engine, error) {
	if opts != nil {
		if err := opts.Validate(); err != nil {
			return nil, err
		}
	}
	return nil, unsupported("New")
}

// Segment returns "".
func (e *Engine) Segment() string { return "" }

// Alloc returns an error wrapping [ErrUnsupported].
func (e *Engine) Alloc(n int) (*Memory, error) { return nil, unsupported("Alloc") }

// Register returns an error wrapping [ErrUnsupported].
func (e *Engine) Register(r rdma.Region) error { return unsupported("Register") }

// Unregister returns an error wrapping [ErrUnsupported].
func (e *Engine) Unregister(r rdma.Region) error { return unsupported("Unregister") }

// Open returns an error wrapping [ErrUnsupported].
func (e *Engine) Open(ctx context.Context, name string) (rdma.SegmentID, error) {
	return 0, unsupported("Open")
}

// CloseSegment returns an error wrapping [ErrUnsupported].
func (e *Engine) CloseSegment(id rdma.SegmentID) error { return unsupported("CloseSegment") }

// NewBatch returns an error wrapping [ErrUnsupported].
func (e *Engine) NewBatch(size int) (rdma.Batch, error) { return nil, unsupported("NewBatch") }

// Close returns nil.
func (e *Engine) Close() error { return nil }

// Memory is shared memory of an Engine; there is none on this system.
type Memory struct{}

// Len returns 0.
func (m *Memory) Len() int { return 0 }

// Region returns the zero Region.
func (m *Memory) Region() rdma.Region { return rdma.Region{} }

// Bytes returns nil.
func (m *Memory) Bytes() []byte { return nil }

// Free returns nil.
func (m *Memory) Free() error { return nil }
