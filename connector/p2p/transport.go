package p2p

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/mooncake"
	"github.com/kvconnect/kvconnect/rdma/shm"
)

// The transfer engines a worker opened by name opens itself, by
// kv_connector_extra_config "transfer", when Env.Engine is nil.
const (
	// TransferLoopback: an [rdma.Loopback] on a fabric of this process
	// that every worker opened by name with it shares; its segment is
	// "<engine_id>/<rank>". For tests and single-process setups.
	TransferLoopback = "loopback"
	// TransferShm: an [shm.Engine] with a fresh segment name, for
	// instances of one host. Its KV memory must come from the engine's
	// Alloc: see [Worker.Engine].
	TransferShm = "shm"
	// TransferMooncake: an rdma/mooncake engine configured from the
	// environment ([mooncake.ConfigFromEnv]: MOONCAKE_LOCAL_HOSTNAME and
	// the others vLLM reads), for instances of many hosts.
	TransferMooncake = "mooncake"
)

var transfers = []string{TransferLoopback, TransferShm, TransferMooncake}

// loopbackFabric returns the fabric of the loopback engines that workers
// opened by name open, creating it at first use. It belongs to the
// registry's state.
func loopbackFabric() *rdma.Fabric {
	opened.Lock()
	defer opened.Unlock()
	if opened.fabric == nil {
		opened.fabric = rdma.NewFabric()
	}
	return opened.fabric
}

// openTransfer opens the transfer engine kind for rank of the instance
// engineID.
func openTransfer(kind, engineID string, rank int, log *slog.Logger, timeout time.Duration) (rdma.Engine, error) {
	switch kind {
	case TransferLoopback:
		e, err := loopbackFabric().NewEngine(fmt.Sprintf("%s/%d", engineID, rank), nil)
		if err != nil {
			return nil, fmt.Errorf("p2p: transfer %q: %w", kind, err)
		}
		return e, nil
	case TransferShm:
		e, err := shm.New(&shm.Options{Logger: log})
		if err != nil {
			return nil, fmt.Errorf("p2p: transfer %q: %w", kind, err)
		}
		return e, nil
	case TransferMooncake:
		cfg, err := mooncake.ConfigFromEnv()
		if err != nil {
			return nil, fmt.Errorf("p2p: transfer %q: %w", kind, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		e, err := mooncake.Open(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("p2p: transfer %q: %w", kind, err)
		}
		return e, nil
	}
	return nil, fmt.Errorf("%w: kv_connector_extra_config.transfer = %q, want %q, %q or %q", connector.ErrConfig, kind, TransferLoopback, TransferShm, TransferMooncake)
}

// hostMem is host memory a worker allocates for its engine's use (its
// mailbox, scratch and digests): an [rdma.HostMemory], or, for an
// [shm.Engine], the engine's own shared [shm.Memory], the only memory it
// registers.
type hostMem interface {
	Region() rdma.Region
	Bytes() []byte
	Free() error
}

// alloc allocates n bytes of host memory that w's engine can register.
func (w *Worker) alloc(n int) (hostMem, error) {
	if e, ok := w.eng.(*shm.Engine); ok {
		m, err := e.Alloc(n)
		if err != nil {
			return nil, err
		}
		return m, nil
	}
	m, err := rdma.AllocHost(n)
	if err != nil {
		return nil, err
	}
	return m, nil
}
