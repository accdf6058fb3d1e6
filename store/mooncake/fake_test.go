//go:build linux

package mooncake

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/internal/dl"
	"github.com/kvconnect/kvconnect/internal/fakelib"
	"github.com/kvconnect/kvconnect/rdma"
)

// fake is the fake library (testdata), built once by TestMain with gcc.
// Only tests load it.
var fake *fakelib.Lib

func TestMain(m *testing.M) {
	fake = fakelib.Build("libmooncake_store.so", []string{"testdata/fake_store.c"}, "-lpthread")
	code := m.Run()
	if err := fake.Remove(); err != nil {
		fmt.Fprintln(os.Stderr, "mooncake tests:", err)
	}
	os.Exit(code)
}

// gcc compiles a shared library from C sources into dir/name.
func gcc(dir, name string, args ...string) (string, error) {
	return fakelib.Compile(dir, name, args...)
}

// needFake returns the path of the fake library, or ends the test: a skip
// when gcc is absent (a failure when MOONCAKE_FAKE_REQUIRE=1), a failure
// when the build failed.
func needFake(t testing.TB) string {
	t.Helper()
	return fake.Need(t, "MOONCAKE_FAKE_REQUIRE")
}

// fakeConfig is a valid config for the fake library.
func fakeConfig(t testing.TB) Config {
	return Config{
		LocalHostname:       "localhost",
		MasterServerAddress: "127.0.0.1:50051",
		GlobalSegmentSize:   256 << 20,
		Library:             needFake(t),
	}
}

// openFake opens a Store on the fake library, closed at the end of the test.
func openFake(t testing.TB, edit func(*Config)) *Store {
	t.Helper()
	cfg := fakeConfig(t)
	if edit != nil {
		edit(&cfg)
	}
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open(fake) = %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	return s
}

// hooks are the fake's test-only exports, and the raw C API for calls
// made around the binding.
type hooks struct {
	api
	calls     func(store uintptr) uint64
	destroyed func(store uintptr) int32
	setupSeen func(store uintptr) int32
	keys      func(store, bytes uintptr) uint64
	replicate func(store, out, seg0, seg0Len uintptr) int32
	setLease  func(store uintptr, ns int64, refusals int32)
	refused   func(store uintptr) uint64
	gateGet   func(store uintptr, r, w int32)
	scratch   *rdma.HostMemory // outputs of the hooks, outside the Go heap
}

func fakeHooks(t testing.TB) *hooks {
	t.Helper()
	lib, err := dl.Open(dl.Search{Name: "fake", Names: []string{needFake(t)}})
	if err != nil {
		t.Fatal(err)
	}
	h := new(hooks)
	syms := []dl.Symbol{
		{Name: "fake_calls", Fn: &h.calls},
		{Name: "fake_destroyed", Fn: &h.destroyed},
		{Name: "fake_setup_seen", Fn: &h.setupSeen},
		{Name: "fake_keys", Fn: &h.keys},
		{Name: "fake_replicate", Fn: &h.replicate},
		{Name: "fake_set_lease", Fn: &h.setLease},
		{Name: "fake_refused", Fn: &h.refused},
		{Name: "fake_gate_get", Fn: &h.gateGet},
	}
	for _, s := range h.api.symbols() {
		syms = append(syms, dl.Symbol{Name: s.name, Fn: s.fn})
	}
	if _, err := lib.BindAll(syms); err != nil {
		t.Fatal(err)
	}
	h.scratch = alloc(t, 4096)
	return h
}

// held returns the keys and bytes the fake holds.
func (h *hooks) held(s *Store) (keys, bytes uint64) {
	b := h.scratch.Bytes()
	n := h.keys(s.handle, h.scratch.Region().Addr)
	return n, *(*uint64)(ptr(b))
}

// replication returns what the fake saw of the last replicate config.
func (h *hooks) replication(s *Store) (seen bool, fields [4]uint64, seg0 string) {
	r := h.scratch.Region()
	b := h.scratch.Bytes()
	clear(b)
	ok := h.replicate(s.handle, r.Addr, r.Addr+64, 256)
	copy(fields[:], unsafeWords(b[:32]))
	seg := b[64 : 64+256]
	return ok == 1, fields, string(seg[:strings.IndexByte(string(seg), 0)])
}

// alloc maps host memory outside the Go heap, freed at the end of the test.
func alloc(t testing.TB, n int) *rdma.HostMemory {
	t.Helper()
	m, err := rdma.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Free(); err != nil {
			t.Error(err)
		}
	})
	return m
}

// registered allocates n bytes and registers them with s.
func registered(t testing.TB, s *Store, n int) *rdma.HostMemory {
	t.Helper()
	m := alloc(t, n)
	if err := s.Register(m.Region()); err != nil {
		t.Fatalf("Register(%v) = %v", m.Region(), err)
	}
	return m
}

// onFreshThread runs fn on a locked OS thread that is discarded afterwards.
func onFreshThread(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		fn()
	}()
	<-done
}
