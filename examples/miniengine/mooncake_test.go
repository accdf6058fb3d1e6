//go:build linux

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/internal/fakelib"
)

// TestMooncakeStore runs the report with -store mooncake over the fake
// libmooncake_store.so that store/mooncake's tests use, built here by gcc
// from its C source: the mini-engine's ON runs go through the purego
// binding of Mooncake's C API. The fake exists only in tests.
func TestMooncakeStore(t *testing.T) {
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
	o := small(t)
	o.Store = "mooncake"
	o.MooncakeConfig = cfgPath
	o.ColdStart = true
	var out, errw bytes.Buffer
	if err := Main(context.Background(), o, &out, &errw); err != nil {
		t.Fatalf("Main -store mooncake: %v\n%s", err, out.String())
	}
	for _, want := range []string{"store: Mooncake Store", "outputs identical: yes", "cold start"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
