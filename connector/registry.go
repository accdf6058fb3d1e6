package connector

import (
	"fmt"
	"slices"
	"sync"
)

var registry struct {
	sync.RWMutex
	drivers map[string]Driver
}

// Register makes a connector driver available under name. It panics if
// name is registered twice or d is nil: both are programmer errors. Drivers
// call it from an init function of their package.
func Register(name string, d Driver) {
	if d == nil {
		panic("connector: Register driver is nil")
	}
	registry.Lock()
	defer registry.Unlock()
	if _, dup := registry.drivers[name]; dup {
		panic("connector: Register called twice for driver " + name)
	}
	if registry.drivers == nil {
		registry.drivers = make(map[string]Driver)
	}
	registry.drivers[name] = d
}

// Drivers returns the names of the registered drivers, sorted.
func Drivers() []string {
	registry.RLock()
	defer registry.RUnlock()
	names := make([]string, 0, len(registry.drivers))
	for name := range registry.drivers {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

func lookup(name string) (Driver, error) {
	registry.RLock()
	d, ok := registry.drivers[name]
	registry.RUnlock()
	if !ok {
		return nil, fmt.Errorf("connector: unknown connector %q (forgotten import?)", name)
	}
	return d, nil
}

// driverFor validates cfg and returns the driver it names.
func driverFor(cfg *Config) (Driver, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return lookup(cfg.Connector)
}

// OpenPlanner opens the scheduler half of the connector cfg.Connector
// names. cfg is validated first.
func OpenPlanner(cfg Config, env Env) (Planner, error) {
	d, err := driverFor(&cfg)
	if err != nil {
		return nil, err
	}
	return d.OpenPlanner(cfg, env)
}

// OpenWorker opens the worker half of the connector cfg.Connector names.
// cfg is validated first.
func OpenWorker(cfg Config, env Env) (Worker, error) {
	d, err := driverFor(&cfg)
	if err != nil {
		return nil, err
	}
	return d.OpenWorker(cfg, env)
}
