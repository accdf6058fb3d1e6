package storeconn

import (
	"fmt"

	"github.com/kvconnect/kvconnect/connector"
)

func init() { connector.Register(Name, registered{}) }

type registered struct{}

func (registered) OpenPlanner(cfg connector.Config, env connector.Env) (connector.Planner, error) {
	s, err := openPlanner(cfg, env)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (registered) OpenWorker(cfg connector.Config, env connector.Env) (connector.Worker, error) {
	w, err := openWorker(cfg, env)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// OpenPlanner opens the scheduler half directly, as
// connector.OpenPlanner does by name, and returns it with its concrete
// type (a connector.Waker, UnsavedReporter, ... without assertions).
// cfg.Connector is empty or [Name]; another name is an error naming it.
// As by name, unset fields of cfg take their defaults (kv_role kv_both)
// and cfg is validated first.
func OpenPlanner(cfg connector.Config, env connector.Env) (*Planner, error) {
	if err := checkDirect(&cfg); err != nil {
		return nil, err
	}
	return openPlanner(cfg, env)
}

// OpenWorker opens the worker half of rank env.Rank directly, as
// connector.OpenWorker does by name, and returns it with its concrete
// type. cfg.Connector is empty or [Name].
func OpenWorker(cfg connector.Config, env connector.Env) (*Worker, error) {
	if err := checkDirect(&cfg); err != nil {
		return nil, err
	}
	return openWorker(cfg, env)
}

// checkDirect does for a direct open what the registry does: the
// defaults (kv_role kv_both, ...), then the config's validation.
func checkDirect(cfg *connector.Config) error {
	if cfg.Connector != "" && cfg.Connector != Name {
		return fmt.Errorf("%w: storeconn: Config.Connector = %q, want %q or empty", connector.ErrConfig, cfg.Connector, Name)
	}
	cfg.Connector = Name
	cfg.EnsureDefaults()
	return cfg.Validate()
}
