//go:build linux

package mooncake

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/internal/dl"
	"github.com/kvconnect/kvconnect/internal/fakelib"
	"github.com/kvconnect/kvconnect/rdma"
)

// fake is the fake library (testdata), built once by TestMain with gcc.
// Only tests load it.
var fake *fakelib.Lib

func TestMain(m *testing.M) {
	fake = fakelib.Build(libraryName, []string{"testdata/fake_transfer_engine.c"}, "-lpthread")
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
	return Config{Library: needFake(t), Hostname: "127.0.0.1", CloseTimeout: 5 * time.Second}
}

// openFake opens an Engine on the fake library, closed at the end of the
// test.
func openFake(t testing.TB, edit func(*Config)) *Engine {
	t.Helper()
	cfg := fakeConfig(t)
	if edit != nil {
		edit(&cfg)
	}
	e, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open(fake) = %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	return e
}

// hooks are the fake's test-only exports.
type hooks struct {
	hold        func(engine uintptr, hold, timeout int32)
	late        func(engine uintptr, polls int32)
	release     func(engine uintptr) int32
	failSubmit  func(engine uintptr, code int32)
	stats       func(engine, out uintptr)
	transport   func(engine, buf, n uintptr)
	location    func(engine, addr, buf, n uintptr)
	layout      func(out uintptr)
	global      func(out uintptr)
	lastEntries func(engine uintptr) uint64
	raw         api              // the C API, for calls made around the binding
	scratch     *rdma.HostMemory // outputs of the hooks, outside the Go heap
	scratchAddr uintptr
}

func fakeHooks(t testing.TB) *hooks {
	t.Helper()
	lib, err := dl.Open(dl.Search{Name: "fake", Names: []string{needFake(t)}})
	if err != nil {
		t.Fatal(err)
	}
	h := new(hooks)
	syms := []dl.Symbol{
		{Name: "fake_hold", Fn: &h.hold},
		{Name: "fake_late", Fn: &h.late},
		{Name: "fake_release", Fn: &h.release},
		{Name: "fake_fail_submit", Fn: &h.failSubmit},
		{Name: "fake_stats", Fn: &h.stats},
		{Name: "fake_transport", Fn: &h.transport},
		{Name: "fake_location", Fn: &h.location},
		{Name: "fake_layout", Fn: &h.layout},
		{Name: "fake_global", Fn: &h.global},
		{Name: "fake_last_entries", Fn: &h.lastEntries},
	}
	for _, s := range h.raw.symbols() {
		syms = append(syms, dl.Symbol{Name: s.name, Fn: s.fn})
	}
	if _, err := lib.BindAll(syms); err != nil {
		t.Fatal(err)
	}
	h.scratch = alloc(t, 8192, 0)
	h.scratchAddr = h.scratch.Region().Addr
	return h
}

// fakeStats are the fake's counters for one engine.
type fakeStats struct {
	Submit, Status, Alloc, Free, Violations, Live, Regions, AutoDiscover uint64
}

func (h *hooks) statsOf(e *Engine) fakeStats {
	h.stats(e.handle, h.scratchAddr)
	w := words(h.scratch.Bytes()[:64])
	return fakeStats{w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]}
}

// live returns the fake's live batches and engines, across the process.
func (h *hooks) live() (batches, engines uint64) {
	h.global(h.scratchAddr)
	w := words(h.scratch.Bytes()[:16])
	return w[0], w[1]
}

func (h *hooks) cstr(fill func(buf, n uintptr)) string {
	b := h.scratch.Bytes()
	clear(b)
	fill(h.scratchAddr, uintptr(len(b)))
	s, _, _ := strings.Cut(string(b), "\x00")
	return s
}

// alloc maps host memory outside the Go heap, filled with fill, freed at
// the end of the test.
func alloc(t testing.TB, n int, fill byte) *rdma.HostMemory {
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
	b := m.Bytes()
	for i := range b {
		b[i] = fill
	}
	return m
}
