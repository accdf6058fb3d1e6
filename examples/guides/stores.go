package guides

import (
	"context"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/remote"
)

// serve: one process serves its store, the others dial it.
func serve(ctx context.Context, st store.Store, cfg connector.Config, env connector.Env) (connector.Worker, error) {
	// guide:begin remote
	srv, err := remote.NewServer(st, remote.ServerOptions{}) // any store.Store
	if err != nil {
		return nil, err
	}
	ln, err := remote.Listen("unix", "/run/user/1000/kv.sock") // mode 0600
	if err != nil {
		return nil, err
	}
	go srv.Serve(ln) // returns remote.ErrServerClosed after srv.Close()

	// in each worker process:
	c, err := remote.Dial(ctx, "unix", "/run/user/1000/kv.sock", remote.ClientOptions{})
	if err != nil {
		return nil, err
	}
	env.Store = c // then as usual:
	w, err := connector.OpenWorker(cfg, env)
	// guide:end
	return w, err
}
