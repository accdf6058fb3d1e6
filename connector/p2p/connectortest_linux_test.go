//go:build linux

package p2p_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/connectortest"
	"github.com/kvconnect/kvconnect/connector/p2p"
	"github.com/kvconnect/kvconnect/rdma/shm"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// openRoleByName opens the p2p connector of one instance by name, its workers
// opening transfer engines of kind; with shm, the KV memory comes from
// each worker's engine.
func openRoleByName(kind string, n *int, role connector.Role) connectortest.OpenFunc {
	return func(cfg connector.Config, env connector.Env) (connectortest.Pair, error) {
		*n++
		cfg.Connector, cfg.Role = p2p.Name, role
		cfg.EngineID = fmt.Sprintf("%s-%d-%d", role, os.Getpid(), *n)
		cfg.Extra = map[string]any{"transfer": kind}
		s, err := connector.OpenPlanner(cfg, env)
		if err != nil {
			return connectortest.Pair{}, err
		}
		p := connectortest.Pair{Planner: s}
		for rank := range env.Identity.Layout.TPSize {
			env.Rank = rank
			w, err := connector.OpenWorker(cfg, env)
			if err != nil {
				return p, err
			}
			p.Workers = append(p.Workers, w)
		}
		if kind == p2p.TransferShm {
			p.Alloc = func(rank, n int) (connectortest.Memory, error) {
				return p.Workers[rank].(*p2p.Worker).Engine().(*shm.Engine).Alloc(n)
			}
		}
		return p, nil
	}
}

// TestConnectorTestCrossProcess runs the harness's handoffs with the
// consumer in another process, opened by name over shm (and over
// mooncake where MOONCAKE_TRANSFER_ENGINE_LIBRARY is set): the two
// instances share nothing but the transfer parameters' bytes.
func TestConnectorTestCrossProcess(t *testing.T) {
	for _, kind := range xprocKinds() {
		t.Run(kind, func(t *testing.T) {
			needTransfer(t, kind)
			var n int
			connectortest.Run(t, openRoleByName(kind, &n, connector.RoleProducer), connectortest.Options{
				NewStore:        func() (store.Store, error) { return memstore.New(memstore.Config{Capacity: 1 << 20}) },
				OpenConsumer:    openRoleByName(kind, &n, connector.RoleConsumer),
				ConsumerProcess: true,
			})
		})
	}
}
