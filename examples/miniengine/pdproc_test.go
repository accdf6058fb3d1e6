package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/connector/p2p"
)

// TestMain runs this binary as an instance of -pd across processes when
// the coordinator (a test) starts it so, as main does.
func TestMain(m *testing.M) {
	if os.Getenv(restartDirEnv) != "" {
		os.Exit(restartChild(context.Background(), os.Stdout, os.Stderr))
	}
	if os.Getenv(pdRoleEnv) != "" {
		os.Exit(pdInstance(context.Background(), os.Stderr))
	}
	if os.Getenv(tpRoleEnv) != "" {
		os.Exit(tpRank(context.Background(), os.Stderr))
	}
	os.Exit(m.Run())
}

// TestPDMooncakeUnset: -pd -pd-transfer mooncake without the Transfer
// Engine's settings is an error naming them, before anything runs.
func TestPDMooncakeUnset(t *testing.T) {
	t.Setenv("MOONCAKE_LOCAL_HOSTNAME", "")
	o := small(t)
	o.PD, o.PDTransfer = true, p2p.TransferMooncake
	var out bytes.Buffer
	err := Main(context.Background(), o, &out, io.Discard)
	for _, want := range []string{"-pd-transfer mooncake", "MOONCAKE_LOCAL_HOSTNAME", "MOONCAKE_TRANSFER_ENGINE_LIBRARY"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Main(-pd -pd-transfer mooncake, MOONCAKE_LOCAL_HOSTNAME unset) = %v, want an error naming %s", err, want)
		}
	}
	if out.Len() != 0 {
		t.Errorf("Main(-pd -pd-transfer mooncake, MOONCAKE_LOCAL_HOSTNAME unset) ran first:\n%s", out.String())
	}
	if _, err := runPDProcs(context.Background(), o); err == nil || !strings.Contains(err.Error(), "MOONCAKE_LOCAL_HOSTNAME") {
		t.Errorf("runPDProcs(-pd-transfer mooncake, MOONCAKE_LOCAL_HOSTNAME unset) = %v, want an error naming it", err)
	}
}

// TestPDTransferRejected: -pd-transfer takes the p2p connector's
// transfer engines only.
func TestPDTransferRejected(t *testing.T) {
	o := defaultOptions()
	o.PD, o.PDTransfer = true, "carrier-pigeon"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), `-pd-transfer = "carrier-pigeon"`) {
		t.Errorf("Validate(-pd-transfer carrier-pigeon) = %v, want an error naming it", err)
	}
}
