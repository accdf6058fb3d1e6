//go:build !linux

package mooncake

import (
	"context"
	"errors"
	"testing"
)

func TestOpenUnsupported(t *testing.T) {
	_, err := Open(context.Background(), Config{Hostname: "127.0.0.1"})
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Open off linux = %v, want ErrUnavailable and errors.ErrUnsupported", err)
	}
}
