package p2p_test

import (
	"errors"
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
// transfer engine per rank on a fabric shared with the other instance;
// the pair's Close closes the engines. With a gate, the engines are
// wrapped by it.
func openRole(f *rdma.Fabric, n *int, role connector.Role, gate *connectortest.Gate) connectortest.OpenFunc {
	return func(cfg connector.Config, env connector.Env) (connectortest.Pair, error) {
		var engines []rdma.Engine
		closeEngines := func() error {
			var errs []error
			for _, e := range engines {
				errs = append(errs, e.Close())
			}
			return errors.Join(errs...)
		}
		for rank := range env.Identity.Layout.TPSize {
			*n++
			e, err := f.NewEngine(fmt.Sprintf("%s-%d-rank%d", role, *n, rank), nil)
			if err != nil {
				return connectortest.Pair{}, errors.Join(err, closeEngines())
			}
			var eng rdma.Engine = e
			if gate != nil {
				eng = gate.Engine(e)
			}
			engines = append(engines, eng)
		}
		cfg.Connector, cfg.Role = p2p.Name, role
		s, ws, err := p2p.New(cfg, env, engines...)
		if err != nil {
			return connectortest.Pair{}, errors.Join(err, closeEngines())
		}
		p := connectortest.Pair{Planner: s, Close: closeEngines}
		for _, w := range ws {
			p.Workers = append(p.Workers, w)
		}
		return p, nil
	}
}

// TestConnectorTest runs the harness's disaggregated checks: prefills on a
// producer, handed on with their transfer parameters, loaded byte for byte
// by a consumer; the consumer's transfers pass through a gate, for
// CloseInFlight.
func TestConnectorTest(t *testing.T) {
	f := rdma.NewFabric()
	var n int // names engines uniquely on the fabric
	gate := connectortest.NewGate()
	connectortest.Run(t, openRole(f, &n, connector.RoleProducer, nil), connectortest.Options{
		NewStore:     func() (store.Store, error) { return memstore.New(memstore.Config{Capacity: 1 << 20}) },
		OpenConsumer: openRole(f, &n, connector.RoleConsumer, gate),
		Gate:         gate,
	})
}
