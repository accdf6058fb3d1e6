package shm

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"

	"github.com/kvconnect/kvconnect/rdma"
)

// ErrUnsupported is returned where shared-memory engines do not work: on
// systems other than Linux, and for memory they cannot share (device
// memory, host memory that is not an engine's [Memory]). It wraps
// [rdma.ErrUnsupported], which also matches errors.ErrUnsupported.
var ErrUnsupported = fmt.Errorf("shm: %w", rdma.ErrUnsupported)

// maxName is the longest segment name: a Linux socket address holds 108
// bytes, the first of which marks the abstract namespace.
const maxName = 107

// Options configure an [Engine]. The zero value is the default.
type Options struct {
	// Name is the engine's segment name, the name its peers open: at most
	// 107 bytes, without NUL bytes or slashes, unique on the host while
	// the engine is open. Empty means a fresh name, from the process id
	// and 128 random bits.
	Name string
	// Workers is the number of goroutines that run the engine's copies.
	// 0 means min(GOMAXPROCS, 4).
	Workers int
	// Logger receives what the engine cannot return to a caller: peers
	// refused (another user's), connections that failed. Nil discards.
	Logger *slog.Logger
}

// Validate reports the first field out of range.
func (o Options) Validate() error {
	switch {
	case len(o.Name) > maxName:
		return fmt.Errorf("shm: Options.Name %q is %d bytes, want at most %d", o.Name, len(o.Name), maxName)
	case strings.ContainsAny(o.Name, "\x00/"):
		return fmt.Errorf("shm: Options.Name %q holds a NUL byte or a slash", o.Name)
	case o.Workers < 0:
		return fmt.Errorf("shm: Options.Workers = %d, want >= 0", o.Workers)
	}
	return nil
}

// EnsureDefaults fills unset fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Name == "" {
		o.Name = fmt.Sprintf("kvconnect-shm-%d-%s", os.Getpid(), rand.Text())
	}
	if o.Workers == 0 {
		o.Workers = min(runtime.GOMAXPROCS(0), 4)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}
