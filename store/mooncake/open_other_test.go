//go:build !linux

package mooncake

import (
	"context"
	"errors"
	"testing"

	"github.com/kvconnect/kvconnect/store"
)

func TestOpenUnsupported(t *testing.T) {
	_, err := Open(context.Background(), Config{MasterServerAddress: "127.0.0.1:50051"})
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Open off linux = %v, want store.ErrUnavailable and errors.ErrUnsupported", err)
	}
}
