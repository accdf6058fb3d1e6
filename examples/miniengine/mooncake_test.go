//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/internal/fakelib"
)

// fakeMooncake builds the fake libmooncake_store.so, points
// MOONCAKE_STORE_LIBRARY at it and returns the path of a client config.
func fakeMooncake(t *testing.T) string {
	t.Helper()
	fake := fakelib.Build("libmooncake_store.so", []string{filepath.Join("..", "..", "store", "mooncake", "testdata", "fake_store.c")}, "-lpthread")
	t.Cleanup(func() { fake.Remove() })
	lib := fake.Need(t, "MOONCAKE_FAKE_REQUIRE")
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "mooncake.json")
	cfg := `{"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
		"master_server_address": "127.0.0.1:50051", "global_segment_size": "256MB", "protocol": "tcp"}`
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOONCAKE_STORE_LIBRARY", lib)
	return cfgPath
}

// TestMooncakeStore runs the report with -store mooncake over the fake
// libmooncake_store.so that store/mooncake's tests use, built here by gcc
// from its C source: the mini-engine's ON runs go through the purego
// binding of Mooncake's C API. The fake exists only in tests.
func TestMooncakeStore(t *testing.T) {
	cfgPath := fakeMooncake(t)
	o := small(t)
	o.Store = "mooncake"
	o.MooncakeConfig = cfgPath
	o.ColdStart = true
	var out, errw bytes.Buffer
	if err := Main(context.Background(), o, &out, &errw); err != nil {
		t.Fatalf("Main -store mooncake: %v\n%s", err, out.String())
	}
	for _, want := range []string{"store: Mooncake Store", "outputs identical: yes", "cold start", "blocks loaded; outputs identical to the run without a connector"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// cancelOn is a writer that cancels a context once it has seen a string.
type cancelOn struct {
	bytes.Buffer
	s      string
	cancel context.CancelFunc
}

func (c *cancelOn) Write(p []byte) (int, error) {
	n, err := c.Buffer.Write(p)
	if strings.Contains(c.Buffer.String(), c.s) {
		c.cancel()
	}
	return n, err
}

// TestMooncakeFlags: -fault-rate applies to the shared Mooncake store
// (failures counted, outputs identical), and -keep keeps the client up
// until interrupted.
func TestMooncakeFlags(t *testing.T) {
	cfgPath := fakeMooncake(t)
	o := small(t)
	o.Store = "mooncake"
	o.MooncakeConfig = cfgPath
	o.FaultRate = 0.2
	o.JSON = true
	var out bytes.Buffer
	if err := Main(context.Background(), o, &out, io.Discard); err != nil {
		t.Fatalf("Main -store mooncake -fault-rate 0.2: %v\n%s", err, out.String())
	}
	var res struct {
		Runs      []Run `json:"runs"`
		Identical bool  `json:"outputs_identical"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || !res.Identical {
		t.Fatalf("-json: %v, identical %v", err, res.Identical)
	}
	var failures int64
	for _, r := range res.Runs {
		failures += r.Failures
	}
	if failures == 0 {
		t.Errorf("-fault-rate 0.2 over Mooncake: no transfer failed; the faults were not applied")
	}

	o.FaultRate, o.JSON = 0, false
	o.Tenant, o.Keep = "kept", true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errw := &cancelOn{s: "-keep:", cancel: cancel}
	out.Reset()
	if err := Main(ctx, o, &out, errw); err != nil {
		t.Fatalf("Main -tenant kept -keep: %v\n%s", err, out.String())
	}
	if !strings.Contains(errw.String(), `keys of tenant "kept"`) || !strings.Contains(out.String(), "outputs identical: yes") {
		t.Errorf("-keep: stderr %q, report:\n%s", errw.String(), out.String())
	}
}
