package scheduler

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
)

// TestNewConnectorOfAnotherIdentity: a connector opened for one identity
// cannot be driven by a scheduler of another (its keys would not name the
// scheduler's blocks): New refuses it, naming both namespaces.
func TestNewConnectorOfAnotherIdentity(t *testing.T) {
	st := e2eStore(t)
	id := e2eIdentity(4)
	other := id
	other.WeightsVersion = "v2"
	conn, err := connector.OpenPlanner(connector.Config{Connector: storeconn.Name}, connector.Env{Identity: other, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cfg := Config{Identity: id, Blocks: 16, MaxBatchedTokens: 16}
	_, err = New(cfg, conn)
	wantNS, _ := id.Namespace()
	connNS, _ := other.Namespace()
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), connNS.String()) || !strings.Contains(err.Error(), wantNS.String()) {
		t.Errorf("New with a connector of another identity = %v, want ErrConfig naming %s and %s", err, connNS, wantNS)
	}
	same, err := connector.OpenPlanner(connector.Config{Connector: storeconn.Name}, connector.Env{Identity: id, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer same.Close()
	if _, err := New(cfg, same); err != nil {
		t.Errorf("New with a connector of the same identity = %v", err)
	}
}
