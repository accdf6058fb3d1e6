package connectortest_test

import (
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/connectortest"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// ExampleRun checks the store connector over the embedded store. The
// OpenFunc opens both halves with the Config the harness chose (its load
// failure policy) and the Env it hands in (the identity, the store, the
// engine's number of blocks): one scheduler half, one worker per rank. A
// test of the connector's package calls Run with it; the store connector
// supports KV cache groups, so the hybrid subtests run too.
func ExampleRun() {
	open := func(cfg connector.Config, env connector.Env) (p connectortest.Pair, err error) {
		cfg.Connector = storeconn.Name
		p.Planner, err = connector.OpenPlanner(cfg, env)
		for env.Rank = 0; err == nil && env.Rank < env.Identity.Layout.TPSize; env.Rank++ {
			var w connector.Worker
			w, err = connector.OpenWorker(cfg, env)
			p.Workers = append(p.Workers, w) // after an error the harness closes the halves that are not nil
		}
		return p, err
	}
	newStore := func() (store.Store, error) { return memstore.New(memstore.Config{Capacity: 8 << 20}) }

	testConnector := func(t *testing.T) {
		connectortest.Run(t, open, connectortest.Options{NewStore: newStore, Groups: true})
	}
	_ = testConnector // func TestConnector(t *testing.T) in the connector's tests
}
