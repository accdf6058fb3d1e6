package p2p_test

import (
	"fmt"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/connectortest"
	"github.com/kvconnect/kvconnect/connector/p2p"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// openRole opens the p2p connector of one instance, with one loopback
// transfer engine per rank on a fabric shared with the other instance.
func openRole(t *testing.T, f *rdma.Fabric, n *int, role connector.Role) connectortest.OpenFunc {
	return func(env connector.Env) (connectortest.Pair, error) {
		var engines []rdma.Engine
		for rank := range env.Identity.Layout.TPSize {
			*n++
			e, err := f.NewEngine(fmt.Sprintf("%s-%d-rank%d", role, *n, rank), nil)
			if err != nil {
				return connectortest.Pair{}, err
			}
			t.Cleanup(func() { e.Close() })
			engines = append(engines, e)
		}
		s, ws, err := p2p.New(connector.Config{Connector: p2p.Name, Role: role}, env, engines...)
		if err != nil {
			return connectortest.Pair{}, err
		}
		p := connectortest.Pair{Scheduler: s}
		for _, w := range ws {
			p.Workers = append(p.Workers, w)
		}
		return p, nil
	}
}

// TestConnectorTest runs the harness's disaggregated checks: prefills on a
// producer, handed on with their transfer parameters, loaded byte for byte
// by a consumer.
func TestConnectorTest(t *testing.T) {
	f := rdma.NewFabric()
	var n int // names engines uniquely on the fabric
	connectortest.Run(t, openRole(t, f, &n, connector.RoleProducer), connectortest.Options{
		NewStore:     func() (store.Store, error) { return memstore.New(memstore.Config{Capacity: 1 << 20}) },
		OpenConsumer: openRole(t, f, &n, connector.RoleConsumer),
	})
}
