package storeconn

import "github.com/kvconnect/kvconnect/connector"

func init() { connector.Register(Name, driver{}) }

type driver struct{}

func (driver) OpenScheduler(cfg connector.Config, env connector.Env) (connector.Scheduler, error) {
	s, err := openScheduler(cfg, env)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (driver) OpenWorker(cfg connector.Config, env connector.Env) (connector.Worker, error) {
	w, err := openWorker(cfg, env)
	if err != nil {
		return nil, err
	}
	return w, nil
}
