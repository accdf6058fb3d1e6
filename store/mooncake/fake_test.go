//go:build linux

package mooncake

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/internal/dl"
	"github.com/kvconnect/kvconnect/rdma"
)

// The fake libmooncake_store.so (testdata/fake_store.c), built once by
// TestMain with gcc into a temporary folder. Only tests load it.
var (
	fakeDir  string // folder of the build outputs
	fakeLib  string // path of the fake library; "" when not built
	fakeSkip string // why it was not built (gcc absent)
	fakeErr  error  // why the build failed (gcc present)
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvconnect-mooncake-fake-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "mooncake tests:", err)
		os.Exit(1)
	}
	fakeDir = dir
	fakeLib, fakeSkip, fakeErr = buildFake(dir)
	code := m.Run()
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, "mooncake tests:", err)
	}
	os.Exit(code)
}

// gcc compiles a shared library from C sources into dir/name.
func gcc(dir, name string, args ...string) (string, error) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command(cc, append([]string{"-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", out}, args...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("gcc %s: %w\n%s", name, err, b)
	}
	return out, nil
}

func buildFake(dir string) (lib, skip string, err error) {
	if _, err := exec.LookPath("gcc"); err != nil {
		return "", "gcc not found on PATH: " + err.Error(), nil
	}
	lib, err = gcc(dir, "libmooncake_store.so", "testdata/fake_store.c", "-lpthread")
	return lib, "", err
}

// needFake returns the path of the fake library, or ends the test: a skip
// when gcc is absent (a failure when MOONCAKE_FAKE_REQUIRE=1), a failure
// when the build failed.
func needFake(t testing.TB) string {
	t.Helper()
	switch {
	case fakeErr != nil:
		t.Fatalf("building the fake libmooncake_store.so: %v", fakeErr)
	case fakeLib == "" && os.Getenv("MOONCAKE_FAKE_REQUIRE") == "1":
		t.Fatalf("MOONCAKE_FAKE_REQUIRE=1 but the fake library cannot be built: %s", fakeSkip)
	case fakeLib == "":
		t.Skipf("fake libmooncake_store.so not built (%s); set MOONCAKE_FAKE_REQUIRE=1 to fail instead", fakeSkip)
	}
	return fakeLib
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
