//go:build linux

package mooncake

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// counters are the Stats counters the binding keeps exactly. Puts counts
// every successful put, of a present key too (the C API does not tell
// them apart), so Puts, Duplicates and BytesIn are not declared; Keys,
// Bytes and Evictions are zero (see Store.Stats).
const counters = storetest.CounterHits | storetest.CounterMisses | storetest.CounterExists |
	storetest.CounterRejectedPuts | storetest.CounterBytesOut

// TestConformance runs the store conformance harness against the binding
// over the fake library: it checks the binding's side of the ABI (layout
// of the arrays, C strings, results) and its mapping of codes to errors.
// The fake grants leases as Mooncake does, in two shapes: for the time of a
// read only (removals wait for reads in flight), and for an hour, so that
// every key the harness has read or probed stays (removals fail with
// store.ErrHasLease, at once). Config.LeaseTTL declares the fake's lease,
// as it would a master's --default_kv_lease_ttl, and the harness checks
// the binding's store.Leaser against what the removals do.
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease time.Duration // granted by the fake
		ttl   time.Duration // declared: Config.LeaseTTL
		wait  time.Duration
	}{
		{"ReadLeases", 0, NoLeaseTTL, 0},
		{"LongLeases", time.Hour, time.Hour, NoRemoveWait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := fakeHooks(t)
			cfg := fakeConfig(t)
			cfg.RemoveLeaseWait = tc.wait
			cfg.LeaseTTL = tc.ttl
			storetest.Run(t, func(t testing.TB) store.Store {
				s, err := Open(context.Background(), cfg)
				if err != nil {
					t.Fatalf("Open(fake) = %v", err)
				}
				h.setLease(s.handle, int64(tc.lease), 0)
				return s
			}, storetest.Options{Capacity: 8 << 20, MaxValueSize: 4096, Registration: true, Counters: counters, WholeBatches: true})
		})
	}
}

// TestConformanceReal runs the same harness against a real Mooncake Store
// when MOONCAKE_STORE_LIBRARY names libmooncake_store.so and
// MOONCAKE_MASTER a running mooncake_master (MOONCAKE_CONFIG_PATH, if set,
// supplies the rest of the config). Each store is one client; they share
// the master, and the harness removes everything between its checks, so
// use a master of its own. The capacity declared is the client's segment:
// the harness fails a store that declares eviction and holds twice its
// declared capacity without evicting. The master's lease is taken to be
// DefaultLeaseTTL unless MOONCAKE_CONFIG_PATH's file declares its
// default_kv_lease_ttl: the harness fails a binding that declares a lease
// the master does not grant.
func TestConformanceReal(t *testing.T) {
	cfg := realConfig(t)
	cfg.RemoveLeaseWait = NoRemoveWait // every key read stays leased for the master's TTL
	storetest.Run(t, func(t testing.TB) store.Store {
		s, err := Open(context.Background(), cfg)
		if err != nil {
			t.Fatalf("Open(%s) = %v", cfg.MasterServerAddress, err)
		}
		return s
	}, storetest.Options{Evicts: true, Capacity: int64(cfg.GlobalSegmentSize), MaxValueSize: 64 << 10, Registration: true, Counters: counters, WholeBatches: true})
}

// realConfig returns the config of a real Mooncake cluster from the
// environment, or skips (saying what to set) when there is none.
func realConfig(t testing.TB) Config {
	t.Helper()
	if os.Getenv(EnvLibrary) == "" || os.Getenv(EnvMaster) == "" {
		t.Skipf("no real Mooncake: set %s to libmooncake_store.so and %s to a running mooncake_master (host:port) to run this",
			EnvLibrary, EnvMaster)
	}
	cfg, err := ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	cfg.MasterServerAddress = os.Getenv(EnvMaster)
	if os.Getenv(EnvConfigPath) == "" && os.Getenv(envSegment) == "" {
		cfg.GlobalSegmentSize = 256 << 20
	}
	if os.Getenv(EnvConfigPath) == "" && os.Getenv(envBuffer) == "" {
		cfg.LocalBufferSize = 16 << 20
	}
	return cfg
}
