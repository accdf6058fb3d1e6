package main

import (
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRemoteStore replays the shared-prefix trace over a memstore served
// by store/remote on a unix socket: the same figures as over memstore.
func TestRemoteStore(t *testing.T) {
	trace := filepath.Join("testdata", "small_shared.jsonl")
	args := []string{"-block", "256", "-instances", "2", "-capacity", "unbounded", "-pool", "4096", "-off=false"}
	mem := replayFile(t, trace, args...)
	rem := replayFile(t, trace, append(args, "-store", "remote")...)
	if diff := cmp.Diff(figures(mem.Runs[0]), figures(rem.Runs[0])); diff != "" {
		t.Errorf("remote against memstore (-memstore +remote):\n%s", diff)
	}
	if rem.Runs[0].ExternalTokens == 0 || rem.Runs[0].Lookups == 0 || rem.Runs[0].Puts == 0 {
		t.Errorf("remote: %d external tokens, %d lookups, %d put calls; want some of each", rem.Runs[0].ExternalTokens, rem.Runs[0].Lookups, rem.Runs[0].Puts)
	}
}
