package storeconn_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/connectortest"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/remote"
)

// TestHarnessWorkersOverRemote runs the connector harness with the
// workers reaching the store the way workers in processes of their own
// do: through store/remote, over a unix socket, while the scheduler half
// uses the store directly. Every byte a worker loads or saves crosses the
// socket.
func TestHarnessWorkersOverRemote(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("unix sockets: not on windows")
	}
	dir := t.TempDir()
	n := 0
	open := func(cfg connector.Config, env connector.Env) (p connectortest.Pair, err error) {
		cfg.Connector = storeconn.Name
		p.Planner, err = connector.OpenPlanner(cfg, env)
		if err != nil {
			return p, err
		}
		n++
		path := filepath.Join(dir, fmt.Sprintf("%d.sock", n))
		ln, err := remote.Listen("unix", path)
		if err != nil {
			return p, err
		}
		srv, err := remote.NewServer(env.Store, remote.ServerOptions{})
		if err != nil {
			ln.Close()
			return p, err
		}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		c, err := remote.Dial(context.Background(), "unix", path, remote.ClientOptions{})
		if err != nil {
			srv.Close()
			<-served
			return p, err
		}
		// The server and the client go with the last worker.
		left := env.Identity.Layout.TPSize
		closed := func() error {
			if left--; left > 0 {
				return nil
			}
			err := errors.Join(c.Close(), srv.Close())
			if serr := <-served; !errors.Is(serr, remote.ErrServerClosed) {
				err = errors.Join(err, fmt.Errorf("Serve: %v, want %v", serr, remote.ErrServerClosed))
			}
			return err
		}
		wenv := env
		wenv.Store = c
		for wenv.Rank = 0; wenv.Rank < env.Identity.Layout.TPSize; wenv.Rank++ {
			w, err := connector.OpenWorker(cfg, wenv)
			if err != nil {
				return p, err
			}
			p.Workers = append(p.Workers, &remoteWorker{w.(*storeconn.Worker), closed})
		}
		return p, nil
	}
	newStore := func() (store.Store, error) { return memstore.New(memstore.Config{Capacity: 8 << 20}) }
	connectortest.Run(t, open, connectortest.Options{NewStore: newStore, Groups: true})
}

// remoteWorker is a worker over a store client that, with the last of its
// pair's workers, closes the client and the server.
type remoteWorker struct {
	*storeconn.Worker
	closed func() error
}

func (w *remoteWorker) Close() error {
	err := w.Worker.Close()
	if w.closed != nil {
		err = errors.Join(err, w.closed())
		w.closed = nil
	}
	return err
}
