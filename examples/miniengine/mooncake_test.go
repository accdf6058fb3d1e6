//go:build linux

package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMooncakeStore runs the report with -store mooncake over the fake
// libmooncake_store.so that store/mooncake's tests use, built here by gcc
// from its C source: the mini-engine's ON runs go through the purego
// binding of Mooncake's C API. The fake exists only in tests.
func TestMooncakeStore(t *testing.T) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		if os.Getenv("MOONCAKE_FAKE_REQUIRE") == "1" {
			t.Fatalf("MOONCAKE_FAKE_REQUIRE=1 but gcc is absent: %v", err)
		}
		t.Skipf("gcc not found, cannot build the fake Mooncake library: %v", err)
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, "libmooncake_store.so")
	src := filepath.Join("..", "..", "store", "mooncake", "testdata", "fake_store.c")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", lib, src, "-lpthread").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
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
