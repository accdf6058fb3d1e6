package prom_test

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/connectortest"
	"github.com/kvconnect/kvconnect/connector/prom"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// TestStoreConnectorInstrumented runs the connector harness on the store
// connector over memstore wrapped by InstrumentStore: the connector
// behaves over the wrapper as over the store. Each pair of halves it
// opens is registered with its collectors on a pedantic registry and
// gathered, and the connector's calls show in the wrapper's counts.
func TestStoreConnectorInstrumented(t *testing.T) {
	var mu sync.Mutex
	var stores []prom.Instrumented
	newStore := func() (store.Store, error) {
		s, err := memstore.New(memstore.Config{Capacity: 8 << 20})
		if err != nil {
			return nil, err
		}
		i := prom.InstrumentStore(s, prom.Options{})
		mu.Lock()
		stores = append(stores, i)
		mu.Unlock()
		return i, nil
	}
	open := func(cfg connector.Config, env connector.Env) (p connectortest.Pair, err error) {
		cfg.Connector = storeconn.Name
		p.Planner, err = connector.OpenPlanner(cfg, env)
		for env.Rank = 0; err == nil && env.Rank < env.Identity.Layout.TPSize; env.Rank++ {
			var w connector.Worker
			w, err = connector.OpenWorker(cfg, env)
			p.Workers = append(p.Workers, w)
		}
		if err != nil {
			return p, err
		}
		reg := prometheus.NewPedanticRegistry()
		sc := prom.NewScheduler(p.Planner, prom.Options{})
		sc.Refresh()
		reg.MustRegister(sc)
		for rank, w := range p.Workers {
			reg.MustRegister(prom.NewWorker(w, rank, prom.Options{}))
		}
		if _, err := reg.Gather(); err != nil {
			t.Errorf("Gather() of the storeconn halves' collectors = %v", err)
		}
		return p, nil
	}
	connectortest.Run(t, open, connectortest.Options{NewStore: newStore, Groups: true})

	var puts, gets float64
	for _, s := range stores {
		mfs, err := gather(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "kvconnect_store_operation_keys_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				switch l := labels(m.GetLabel()); {
				case l["operation"] == "put" && l["status"] == "ok":
					puts += m.GetCounter().GetValue()
				case l["operation"] == "get" && l["status"] == "ok":
					gets += m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Logf("%d stores: %v keys put, %v keys read through the wrapper", len(stores), puts, gets)
	if puts == 0 || gets == 0 {
		t.Errorf("the connector put %v and read %v keys through the wrapper, want some of each", puts, gets)
	}
}
