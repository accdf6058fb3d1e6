package p2p_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/connectortest"
	"github.com/kvconnect/kvconnect/connector/p2p"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// openByName opens the halves through the registry, as an engine that
// knows the connector only by its name in kv_transfer_config does: the
// scheduler half under a fresh engine_id, then one worker per rank with
// its engine in Env.Engine.
func openByName(f *rdma.Fabric, n *int, role connector.Role) connectortest.OpenFunc {
	return func(cfg connector.Config, env connector.Env) (connectortest.Pair, error) {
		*n++
		cfg.Connector, cfg.Role, cfg.EngineID = p2p.Name, role, fmt.Sprintf("%s-byname-%d", role, *n)
		var engines []rdma.Engine
		closeEngines := func() error {
			var errs []error
			for _, e := range engines {
				errs = append(errs, e.Close())
			}
			return errors.Join(errs...)
		}
		s, err := connector.OpenPlanner(cfg, env)
		if err != nil {
			return connectortest.Pair{}, err
		}
		p := connectortest.Pair{Planner: s, Close: closeEngines}
		for rank := range env.Identity.Layout.TPSize {
			e, err := f.NewEngine(fmt.Sprintf("%s-rank%d", cfg.EngineID, rank), nil)
			if err != nil {
				return connectortest.Pair{}, errors.Join(err, s.Close(), closeEngines())
			}
			engines = append(engines, e)
			env.Rank, env.Engine = rank, e
			w, err := connector.OpenWorker(cfg, env)
			if err != nil {
				return connectortest.Pair{}, errors.Join(err, s.Close(), closeEngines())
			}
			p.Workers = append(p.Workers, w)
		}
		return p, nil
	}
}

// TestConnectorTestByName runs the harness's disaggregated checks over
// halves opened by name.
func TestConnectorTestByName(t *testing.T) {
	f := rdma.NewFabric()
	var n int
	connectortest.Run(t, openByName(f, &n, connector.RoleProducer), connectortest.Options{
		NewStore:     func() (store.Store, error) { return memstore.New(memstore.Config{Capacity: 1 << 20}) },
		OpenConsumer: openByName(f, &n, connector.RoleConsumer),
	})
}

// TestOpenByNameMisuse: what opening by name needs, each missing piece an
// error naming it.
func TestOpenByNameMisuse(t *testing.T) {
	f := rdma.NewFabric()
	e, err := f.NewEngine("misuse", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	id := hashing.Identity{
		Tenant: "acme", Model: "m", WeightsVersion: "v1",
		Format: hashing.Format{Device: "cpu", ModelDType: "bf16", KVDType: "bf16"},
		Layout: hashing.Layout{Layers: 2, KVHeads: 4, HeadDim: 8, BlockSize: 4, TPSize: 1, Replication: 1},
	}
	cfg := connector.Config{Connector: p2p.Name, Role: connector.RoleProducer, EngineID: "misuse-1"}
	want := func(what string, err error, text string) {
		t.Helper()
		if !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), text) {
			t.Errorf("%s: %v, want ErrConfig containing %q", what, err, text)
		}
	}
	noID := cfg
	noID.EngineID = ""
	_, err = connector.OpenPlanner(noID, connector.Env{Identity: id})
	want("no engine_id", err, "engine_id is empty")
	_, err = connector.OpenWorker(cfg, connector.Env{Identity: id, Engine: e})
	want("worker first", err, `no scheduler half of engine_id "misuse-1" is open in this process`)
	s, err := connector.OpenPlanner(cfg, connector.Env{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	_, err = connector.OpenPlanner(cfg, connector.Env{Identity: id})
	want("twice", err, `a scheduler half of engine_id "misuse-1" is already open`)
	_, err = connector.OpenWorker(cfg, connector.Env{Identity: id})
	want("no engine", err, "set Env.Engine")
	other := id
	other.WeightsVersion = "other"
	_, err = connector.OpenWorker(cfg, connector.Env{Identity: other, Engine: e})
	want("another identity", err, "is not the identity of the scheduler half")
	_, err = connector.OpenWorker(cfg, connector.Env{Identity: id, Engine: e, Rank: 9})
	want("rank", err, "Env.Rank = 9")
	w, err := connector.OpenWorker(cfg, connector.Env{Identity: id, Engine: e})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Closing the scheduler half frees the engine_id.
	s, err = connector.OpenPlanner(cfg, connector.Env{Identity: id})
	if err != nil {
		t.Fatalf("open after Close: %v", err)
	}
	s.Close()
}
