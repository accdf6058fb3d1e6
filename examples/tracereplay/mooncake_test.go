//go:build linux

package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kvconnect/kvconnect/internal/fakelib"
)

// TestMooncakeStore replays the shared-prefix trace with -store mooncake
// over the fake libmooncake_store.so of store/mooncake's tests, built here
// by gcc from its C source: the same figures as over memstore, through the
// purego binding of Mooncake's C API.
func TestMooncakeStore(t *testing.T) {
	fake := fakelib.Build("libmooncake_store.so", []string{filepath.Join("..", "..", "store", "mooncake", "testdata", "fake_store.c")}, "-lpthread")
	t.Cleanup(func() { fake.Remove() })
	lib := fake.Need(t, "MOONCAKE_FAKE_REQUIRE")
	cfg := filepath.Join(t.TempDir(), "mooncake.json")
	if err := os.WriteFile(cfg, []byte(`{"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
		"master_server_address": "127.0.0.1:50051", "global_segment_size": "256MB", "protocol": "tcp"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOONCAKE_STORE_LIBRARY", lib)
	trace := filepath.Join("testdata", "small_shared.jsonl")
	args := []string{"-block", "256", "-instances", "2", "-pool", "4096", "-off=false"}
	mem := replayFile(t, trace, append(args, "-capacity", "unbounded")...)
	mc := replayFile(t, trace, append(args, "-capacity", "1M", "-store", "mooncake", "-mooncake-config", cfg)...)
	if diff := cmp.Diff(figures(mem.Runs[0]), figures(mc.Runs[0])); diff != "" {
		t.Errorf("mooncake against memstore (-memstore +mooncake):\n%s", diff)
	}
	if mc.Runs[0].CapacityTokens != -1 {
		t.Errorf("capacity_tokens = %d, want -1 (the store's own)", mc.Runs[0].CapacityTokens)
	}
}
