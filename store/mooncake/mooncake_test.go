//go:build linux

package mooncake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

func TestOpenMissingLibrary(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libmooncake_store.so")
	cfg := Config{MasterServerAddress: "127.0.0.1:50051", Library: missing}
	_, err := Open(context.Background(), cfg)
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(fmt.Sprint(err), missing) {
		t.Errorf("Open(Library: %s) = %v, want store.ErrUnavailable naming the path", missing, err)
	}

	t.Setenv(EnvLibrary, missing)
	cfg.Library = ""
	_, err = Open(context.Background(), cfg)
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(fmt.Sprint(err), EnvLibrary) {
		t.Errorf("Open(%s=%s) = %v, want store.ErrUnavailable naming %s", EnvLibrary, missing, err, EnvLibrary)
	}
}

func TestOpenMissingRuntimeLibrary(t *testing.T) {
	needFake(t)
	depDir, libDir := t.TempDir(), t.TempDir()
	src := filepath.Join(depDir, "dep.c")
	if err := os.WriteFile(src, []byte("int kvc_dep(void) { return 1; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := gcc(depDir, "libkvcdep.so", src); err != nil {
		t.Fatal(err)
	}
	lib, err := gcc(libDir, "libmooncake_store.so", "testdata/fake_store.c", "-lpthread",
		"-Wl,--no-as-needed", "-L"+depDir, "-lkvcdep")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(depDir, "libkvcdep.so")); err != nil {
		t.Fatal(err)
	}
	_, err = Open(context.Background(), Config{MasterServerAddress: "127.0.0.1:50051", Library: lib})
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(fmt.Sprint(err), "libkvcdep.so") {
		t.Errorf("Open(library needing an absent libkvcdep.so) = %v, want store.ErrUnavailable naming libkvcdep.so", err)
	}
}

func TestOpenNotMooncake(t *testing.T) {
	needFake(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "other.c")
	if err := os.WriteFile(src, []byte("int mooncake_store_health_check(void *s) { return s ? 0 : 1; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := gcc(dir, "libother.so", src)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(context.Background(), Config{MasterServerAddress: "127.0.0.1:50051", Library: lib})
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(fmt.Sprint(err), "mooncake_store_create") {
		t.Errorf("Open(library without the C API) = %v, want store.ErrUnavailable naming mooncake_store_create", err)
	}
}

func TestOpenSetupFails(t *testing.T) {
	cfg := fakeConfig(t)
	cfg.MasterServerAddress = "fake:fail"
	_, err := Open(context.Background(), cfg)
	var e Error
	if !errors.Is(err, store.ErrUnavailable) || !errors.As(err, &e) || e != (Error{Op: opSetup, Code: CodeInternal}) {
		t.Errorf("Open(master fake:fail) = %v, want Error{setup, -1} matching store.ErrUnavailable", err)
	}
	cfg.MasterServerAddress = "127.0.0.1:50051"
	cfg.Protocol = "efa" // a known protocol this library was not built with
	_, err = Open(context.Background(), cfg)
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(fmt.Sprint(err), "efa") {
		t.Errorf("Open(protocol efa on a tcp-only library) = %v, want store.ErrUnavailable naming the protocol", err)
	}
}

func TestOpenBadConfig(t *testing.T) {
	cfg := fakeConfig(t)
	cfg.Protocol = "carrier-pigeon"
	_, err := Open(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "protocol") || !strings.Contains(err.Error(), "carrier-pigeon") {
		t.Errorf("Open(protocol carrier-pigeon) = %v, want an error naming the field and value", err)
	}
	cfg = fakeConfig(t)
	cfg.MasterServerAddress = ""
	if _, err := Open(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "master_server_address") {
		t.Errorf("Open(no master) = %v, want an error naming master_server_address", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Open(ctx, fakeConfig(t)); !errors.Is(err, context.Canceled) {
		t.Errorf("Open(canceled ctx) = %v, want context.Canceled", err)
	}
}

// The client is set up on a thread that is not the main thread and has
// INT, TERM, HUP and USR1 unblocked, although create blocked them.
func TestOpenThreadAndSignals(t *testing.T) {
	h := fakeHooks(t)
	s := openFake(t, nil)
	if seen := h.setupSeen(s.handle); seen != 0 {
		t.Errorf("setup through Open saw signals blocked=%v, main thread=%v; want neither", seen&1 != 0, seen&2 != 0)
	}
	// The fake can tell: create then setup without unblocking is seen.
	var seen int32
	onFreshThread(func() {
		hs := h.create()
		a := alloc(t, 64)
		addr := a.Region().Addr
		copy(a.Bytes(), "localhost\x00P2PHANDSHAKE\x00tcp\x00\x00127.0.0.1:50051\x00")
		if rc := h.setup(hs, addr, addr+10, 1<<20, 0, addr+23, addr+27, addr+28); rc != 0 {
			t.Errorf("raw setup = %d", rc)
		}
		seen = h.setupSeen(hs)
		h.destroy(hs)
	})
	if seen&1 == 0 {
		t.Errorf("raw create+setup: fake saw signals unblocked; the check in this test cannot fail")
	}
}

// Open returns when ctx ends, and the setup that goes on is undone when
// it finishes.
func TestOpenContextEndsDuringSetup(t *testing.T) {
	cfg := fakeConfig(t)
	gateR, gateW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	noteR, noteW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []*os.File{gateR, gateW, noteR, noteW} {
		t.Cleanup(func() { f.Close() })
	}
	cfg.MasterServerAddress = fmt.Sprintf("fake:wait=%d,%d", gateR.Fd(), noteW.Fd())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Open(ctx, cfg)
		done <- err
	}()
	note := make([]byte, 1)
	if _, err := noteR.Read(note); err != nil || note[0] != 's' {
		t.Fatalf("reading setup's note = %q, %v; want 's'", note, err)
	}
	select {
	case err := <-done:
		t.Fatalf("Open returned %v while setup was blocked", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Open = %v, want context.Canceled", err)
	}
	if _, err := gateW.Write([]byte{1}); err != nil { // let setup finish
		t.Fatal(err)
	}
	if _, err := noteR.Read(note); err != nil || note[0] != 'd' {
		t.Fatalf("reading destroy's note = %q, %v; want 'd'", note, err)
	}
}

func TestCloseOnce(t *testing.T) {
	h := fakeHooks(t)
	s, err := Open(context.Background(), fakeConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	m := registered(t, s, 4096)
	for range 2 {
		if err := s.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	}
	if n := h.destroyed(s.handle); n != 1 {
		t.Errorf("destroy called %d times, want 1", n)
	}
	ctx := context.Background()
	res := make([]store.Result, 1)
	for name, err := range map[string]error{
		"Exists":       s.Exists(ctx, []string{"k"}, res),
		"Put":          s.Put(ctx, []string{"k"}, []rdma.Region{m.Region()}, res),
		"Get":          s.Get(ctx, []string{"k"}, []rdma.Region{m.Region()}, res),
		"Remove":       s.Remove(ctx, "k"),
		"Register":     s.Register(m.Region()),
		"Unregister":   s.Unregister(m.Region()),
		"RemovePrefix": second(s.RemovePrefix(ctx, "k")),
		"RemoveAll":    second(s.RemoveAll(ctx)),
		"HealthCheck":  s.HealthCheck(),
	} {
		if !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close = %v, want store.ErrClosed", name, err)
		}
	}
}

func second(_ int, err error) error { return err }

// keysN returns n distinct keys.
func keysN(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/%05d", prefix, i)
	}
	return keys
}

// slots cuts m into n regions of size bytes each.
func slots(t testing.TB, m *rdma.HostMemory, n, size int) []rdma.Region {
	t.Helper()
	out := make([]rdma.Region, n)
	for i := range out {
		r, err := m.Region().Sub(i*size, size)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = r
	}
	return out
}

func TestOneNativeCallPerBatch(t *testing.T) {
	h := fakeHooks(t)
	s := openFake(t, func(c *Config) { c.PresenceOnly = true })
	const n, size = 256, 64
	src := slots(t, registered(t, s, n*size), n, size)
	dst := slots(t, registered(t, s, n*size), n, size)
	keys := keysN("calls", n)
	keys[7] = "bad key" // rejected in Go, the rest still go in one call
	res := make([]store.Result, n)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Put", func() error { return s.Put(ctx, keys, src, res) }},
		{"Exists", func() error { return s.Exists(ctx, keys, res) }},
		{"Get", func() error { return s.Get(ctx, keys, dst, res) }},
	} {
		before := h.calls(s.handle)
		if err := c.call(); err != nil {
			t.Fatalf("%s = %v", c.name, err)
		}
		if got := h.calls(s.handle) - before; got != 1 {
			t.Errorf("%s of %d keys made %d native calls, want 1", c.name, n, got)
		}
		for i, r := range res {
			if (r.Err != nil) != (i == 7) {
				t.Errorf("%s: res[%d] = %+v", c.name, i, r)
			}
		}
	}
	for i, r := range res {
		if i != 7 && r.N != size {
			t.Fatalf("Get res[%d] = %+v, want N %d", i, r, size)
		}
	}
	before := h.calls(s.handle)
	if err := s.Put(ctx, []string{"bad key", ""}, src[:2], res[:2]); err != nil {
		t.Fatal(err)
	}
	if got := h.calls(s.handle) - before; got != 0 {
		t.Errorf("Put of only invalid keys made %d native calls, want 0", got)
	}
}

// Without PresenceOnly, Exists asks the size of each key found.
func TestExistsSizes(t *testing.T) {
	h := fakeHooks(t)
	s := openFake(t, nil)
	ctx := context.Background()
	m := registered(t, s, 300)
	res := make([]store.Result, 3)
	keys := []string{"s/100", "s/absent", "s/300"}
	if err := s.Put(ctx, []string{"s/100", "s/300"}, []rdma.Region{{Addr: m.Region().Addr, Len: 100, Loc: rdma.Host}, m.Region()}, res[:2]); err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatal(err)
	}
	before := h.calls(s.handle)
	if err := s.Exists(ctx, keys, res); err != nil {
		t.Fatal(err)
	}
	if got := h.calls(s.handle) - before; got != 3 {
		t.Errorf("Exists of 2 present keys and 1 absent made %d native calls, want 3 (one batch, two sizes)", got)
	}
	if res[0] != (store.Result{N: 100}) || res[2] != (store.Result{N: 300}) || !errors.Is(res[1].Err, store.ErrNotFound) {
		t.Errorf("Exists(%q) = %+v, want sizes 100, 300 and ErrNotFound", keys, res)
	}
}

// fill writes a recognizable pattern for key into b.
func fill(b []byte, key string) {
	for i := range b {
		b[i] = key[i%len(key)] ^ byte(i)
	}
}

func TestPutGetRoundTrip(t *testing.T) {
	h := fakeHooks(t)
	s := openFake(t, nil)
	ctx := context.Background()
	const n, size = 32, 1000
	srcMem, dstMem := registered(t, s, n*size), registered(t, s, n*size)
	src, dst := slots(t, srcMem, n, size), slots(t, dstMem, n, size)
	keys := keysN("rt", n)
	for i, k := range keys {
		fill(src[i].Bytes(), k)
	}
	res := make([]store.Result, n)
	if err := s.Put(ctx, keys, src, res); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r != (store.Result{N: size}) {
			t.Fatalf("Put res[%d] = %+v, want {N: %d}", i, r, size)
		}
	}
	if k, b := h.held(s); k != n || b != n*size {
		t.Errorf("fake holds %d keys, %d bytes; want %d, %d", k, b, n, n*size)
	}
	if err := s.Get(ctx, keys, dst, res); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r != (store.Result{N: size}) || !bytes.Equal(dst[i].Bytes(), src[i].Bytes()) {
			t.Fatalf("Get res[%d] = %+v, bytes equal %v", i, r, bytes.Equal(dst[i].Bytes(), src[i].Bytes()))
		}
	}
	// First writer wins, also within one batch.
	other := registered(t, s, size)
	fill(other.Bytes(), "something else")
	two := []string{"dup", "dup"}
	if err := s.Put(ctx, two, []rdma.Region{src[0], other.Region()}, res[:2]); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]store.Result{{N: size}, {N: size}}, res[:2], cmp.Comparer(func(a, b error) bool { return a == b })); diff != "" {
		t.Errorf("Put of a repeated key (-want +got):\n%s", diff)
	}
	if err := s.Put(ctx, keys[:1], []rdma.Region{other.Region()}, res[:1]); err != nil || res[0] != (store.Result{N: size}) {
		t.Errorf("Put of a present key = %v, %+v; want success", err, res[0])
	}
	if err := s.Get(ctx, []string{"dup", keys[0]}, dst[:2], res[:2]); err != nil {
		t.Fatal(err)
	}
	for i, want := range [][]byte{src[0].Bytes(), src[0].Bytes()} {
		if !bytes.Equal(dst[i].Bytes(), want) {
			t.Errorf("Get after second put: value %d is not the first writer's", i)
		}
	}
	st := s.Stats()
	if st.Puts != n+2 || st.Duplicates != 1 || st.Hits != n+2 || st.BytesIn != int64(n+2)*size {
		t.Errorf("Stats() = %+v", st)
	}
}

func TestReplicateConfig(t *testing.T) {
	h := fakeHooks(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		edit   func(*Config)
		seen   bool
		fields [4]uint64
		seg0   string
	}{
		{"default", nil, false, [4]uint64{}, ""},
		{"replicas and segments", func(c *Config) {
			c.ReplicaNum = 3
			c.PreferredSegments = []string{"node-a:12300", "node-b"}
		}, true, [4]uint64{3, 0, 0, 2}, "node-a:12300"},
		{"replicas only", func(c *Config) { c.ReplicaNum = 2 }, true, [4]uint64{2, 0, 0, 0}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openFake(t, tc.edit)
			m := registered(t, s, 64)
			res := make([]store.Result, 1)
			if err := s.Put(ctx, []string{"k"}, []rdma.Region{m.Region()}, res); err != nil || res[0].Err != nil {
				t.Fatalf("Put = %v, %v", err, res[0].Err)
			}
			seen, fields, seg0 := h.replication(s)
			if seen != tc.seen || fields != tc.fields || seg0 != tc.seg0 {
				t.Errorf("fake saw config %v %v %q, want %v %v %q", seen, fields, seg0, tc.seen, tc.fields, tc.seg0)
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	h := fakeHooks(t)
	s := openFake(t, nil)
	ctx := context.Background()
	const size = 256
	m := registered(t, s, 4*size)
	r := slots(t, m, 4, size)
	unreg := alloc(t, size)
	inside := r[0]
	straddle := rdma.Region{Addr: m.Region().End() - 10, Len: 20, Loc: rdma.Host}

	for _, tc := range []struct {
		name string
		key  string
		reg  rdma.Region
		want error
	}{
		{"space in key", "a key", inside, store.ErrInvalidKey},
		{"empty key", "", inside, store.ErrInvalidKey},
		{"control byte", "k\x00ey", inside, store.ErrInvalidKey},
		{"non-ASCII", "clé", inside, store.ErrInvalidKey},
		{"long key", strings.Repeat("k", store.MaxKeyLen+1), inside, store.ErrInvalidKey},
		{"unregistered region", "k1", unreg.Region(), store.ErrInvalidRegion},
		{"straddling region", "k2", straddle, store.ErrInvalidRegion},
		{"empty region", "k3", rdma.Region{Addr: r[1].Addr, Loc: rdma.Host}, store.ErrInvalidRegion},
		{"zero address", "k4", rdma.Region{Len: 8, Loc: rdma.Host}, store.ErrInvalidRegion},
		{"device region", "k5", rdma.Region{Addr: r[1].Addr, Len: 8, Loc: rdma.Device(0)}, store.ErrInvalidRegion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := h.calls(s.handle)
			keys0, _ := h.held(s)
			res := make([]store.Result, 2)
			err := s.Put(ctx, []string{tc.key, "good/" + strings.ReplaceAll(tc.name, " ", "-")}, []rdma.Region{tc.reg, r[2]}, res)
			if err != nil {
				t.Fatalf("Put = %v, want per-key errors only", err)
			}
			if !errors.Is(res[0].Err, tc.want) || res[0].N != 0 {
				t.Errorf("Put res[0] = %+v, want %v", res[0], tc.want)
			}
			if res[1] != (store.Result{N: size}) {
				t.Errorf("Put res[1] (a good key beside it) = %+v", res[1])
			}
			if keys1, _ := h.held(s); keys1 != keys0+1 {
				t.Errorf("fake holds %d keys after, %d before; want one more", keys1, keys0)
			}
			if got := h.calls(s.handle) - calls; got != 1 {
				t.Errorf("native calls = %d, want 1", got)
			}
			if err := s.Get(ctx, []string{tc.key}, []rdma.Region{tc.reg}, res[:1]); err != nil || !errors.Is(res[0].Err, tc.want) {
				t.Errorf("Get = %v, %+v; want %v", err, res[0], tc.want)
			}
		})
	}

	t.Run("buffer too small", func(t *testing.T) {
		res := make([]store.Result, 1)
		fill(r[0].Bytes(), "big")
		if err := s.Put(ctx, []string{"big"}, r[:1], res); err != nil || res[0].Err != nil {
			t.Fatal(err, res[0].Err)
		}
		small := rdma.Region{Addr: r[3].Addr, Len: size - 1, Loc: rdma.Host}
		clear(r[3].Bytes())
		if err := s.Get(ctx, []string{"big"}, []rdma.Region{small}, res); err != nil || !errors.Is(res[0].Err, store.ErrBufferTooSmall) {
			t.Errorf("Get into %d bytes of a %d-byte value = %v, %+v; want store.ErrBufferTooSmall", size-1, size, err, res[0])
		}
		if !bytes.Equal(r[3].Bytes(), make([]byte, size)) {
			t.Errorf("Get into a too small region wrote to it")
		}
		var e Error
		if !errors.As(res[0].Err, &e) || e.Code != CodeInvalidParams {
			t.Errorf("error %v is not Error{-600}", res[0].Err)
		}
	})

	t.Run("not found", func(t *testing.T) {
		res := make([]store.Result, 1)
		if err := s.Get(ctx, []string{"absent"}, r[3:], res); err != nil || !errors.Is(res[0].Err, store.ErrNotFound) {
			t.Errorf("Get(absent) = %v, %+v", err, res[0])
		}
		if err := s.Exists(ctx, []string{"absent"}, res); err != nil || !errors.Is(res[0].Err, store.ErrNotFound) {
			t.Errorf("Exists(absent) = %v, %+v", err, res[0])
		}
		if err := s.Remove(ctx, "absent"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Remove(absent) = %v", err)
		}
	})

	t.Run("slice lengths", func(t *testing.T) {
		calls := h.calls(s.handle)
		if err := s.Put(ctx, []string{"a", "b"}, r[:1], make([]store.Result, 2)); err == nil {
			t.Error("Put with 2 keys and 1 region succeeded")
		}
		if err := s.Get(ctx, []string{"a"}, r[:1], nil); err == nil {
			t.Error("Get with no result slots succeeded")
		}
		if err := s.Exists(ctx, []string{"a"}, make([]store.Result, 2)); err == nil {
			t.Error("Exists with 2 result slots for 1 key succeeded")
		}
		if got := h.calls(s.handle) - calls; got != 0 {
			t.Errorf("native calls = %d, want 0", got)
		}
	})

	t.Run("register", func(t *testing.T) {
		freed, err := rdma.AllocHost(8192)
		if err != nil {
			t.Fatal(err)
		}
		fr := freed.Region()
		if err := freed.Free(); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			r    rdma.Region
		}{
			{"unmapped", fr},
			{"overlapping", straddle},
			{"same again", m.Region()},
			{"empty", rdma.Region{Addr: unreg.Region().Addr, Loc: rdma.Host}},
			{"negative", rdma.Region{Addr: unreg.Region().Addr, Len: -1, Loc: rdma.Host}},
			{"device", rdma.Region{Addr: 1 << 40, Len: 4096, Loc: rdma.Device(0)}},
			{"wrapping", rdma.Region{Addr: ^uintptr(0) - 10, Len: 100, Loc: rdma.Host}},
		} {
			calls := h.calls(s.handle)
			if err := s.Register(tc.r); !errors.Is(err, store.ErrInvalidRegion) {
				t.Errorf("Register(%s %+v) = %v, want store.ErrInvalidRegion", tc.name, tc.r, err)
			}
			if got := h.calls(s.handle) - calls; got != 0 {
				t.Errorf("Register(%s): %d native calls, want 0", tc.name, got)
			}
		}
		if err := s.Unregister(unreg.Region()); !errors.Is(err, store.ErrInvalidRegion) {
			t.Errorf("Unregister(never registered) = %v, want store.ErrInvalidRegion", err)
		}
		if err := s.Unregister(r[0]); !errors.Is(err, store.ErrInvalidRegion) {
			t.Errorf("Unregister(part of a registered region) = %v, want store.ErrInvalidRegion", err)
		}
	})

	t.Run("prefix", func(t *testing.T) {
		if _, err := s.RemovePrefix(ctx, ""); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("RemovePrefix(\"\") = %v, want store.ErrInvalidKey", err)
		}
		if _, err := s.RemovePrefix(ctx, "a b"); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("RemovePrefix(\"a b\") = %v, want store.ErrInvalidKey", err)
		}
	})
}

func TestUnregister(t *testing.T) {
	h := fakeHooks(t)
	s := openFake(t, nil)
	ctx := context.Background()
	m := alloc(t, 4096)
	if err := s.Register(m.Region()); err != nil {
		t.Fatal(err)
	}
	res := make([]store.Result, 1)
	if err := s.Put(ctx, []string{"u"}, []rdma.Region{m.Region()}, res); err != nil || res[0].Err != nil {
		t.Fatal(err, res[0].Err)
	}
	if err := s.Unregister(m.Region()); err != nil {
		t.Fatalf("Unregister = %v", err)
	}
	calls := h.calls(s.handle)
	if err := s.Get(ctx, []string{"u"}, []rdma.Region{m.Region()}, res); err != nil || !errors.Is(res[0].Err, store.ErrInvalidRegion) {
		t.Errorf("Get into an unregistered region = %v, %+v; want store.ErrInvalidRegion", err, res[0])
	}
	if got := h.calls(s.handle) - calls; got != 0 {
		t.Errorf("native calls = %d, want 0", got)
	}
	// Registering it again works, also in two halves.
	a, _ := m.Region().Sub(0, 2048)
	b, _ := m.Region().Sub(2048, 2048)
	for _, r := range []rdma.Region{b, a} {
		if err := s.Register(r); err != nil {
			t.Fatalf("Register(%+v) = %v", r, err)
		}
	}
	if err := s.Get(ctx, []string{"u", "u"}, []rdma.Region{m.Region(), a}, make([]store.Result, 2)); err != nil {
		t.Fatal(err)
	}
}

func TestRemovePrefixEscapes(t *testing.T) {
	s := openFake(t, nil)
	ctx := context.Background()
	m := registered(t, s, 64)
	keys := []string{"t1/a.b/x", "t1/axb/x", "t1/a.b", "t2/a.b/x", "xt1/a.b/x", "t1/a.bc", "(x)+[y]{z}|^$?*\\/1", "(x)+[y]{z}|^$?*\\/2", "(x)+[y]{z}"}
	res := make([]store.Result, len(keys))
	regs := make([]rdma.Region, len(keys))
	for i := range regs {
		regs[i] = m.Region()
	}
	if err := s.Put(ctx, keys, regs, res); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		prefix string
		n      int
	}{
		{"t1/a.b", 3}, // t1/a.b/x, t1/a.b, t1/a.bc; not t1/axb/x nor xt1/...
		{"(x)+[y]{z}|^$?*\\/", 2},
		{"zzz", 0},
	} {
		n, err := s.RemovePrefix(ctx, tc.prefix)
		if err != nil || n != tc.n {
			t.Errorf("RemovePrefix(%q) = %d, %v; want %d", tc.prefix, n, err, tc.n)
		}
	}
	left := []string{"t1/axb/x", "t2/a.b/x", "xt1/a.b/x", "(x)+[y]{z}"}
	if err := s.Exists(ctx, left, res[:len(left)]); err != nil {
		t.Fatal(err)
	}
	for i, r := range res[:len(left)] {
		if r.Err != nil {
			t.Errorf("%q was removed: %v", left[i], r.Err)
		}
	}
	if n, err := s.RemoveAll(ctx); err != nil || n != len(left) {
		t.Errorf("RemoveAll() = %d, %v; want %d", n, err, len(left))
	}
}

func TestHostnameAndHealth(t *testing.T) {
	s := openFake(t, func(c *Config) { c.LocalHostname = "node-7" })
	if h, err := s.Hostname(); err != nil || h != "node-7:12300" {
		t.Errorf("Hostname() = %q, %v; want node-7:12300", h, err)
	}
	if err := s.HealthCheck(); err != nil {
		t.Errorf("HealthCheck() = %v", err)
	}
}

func TestConcurrentCalls(t *testing.T) {
	s := openFake(t, nil)
	ctx := context.Background()
	const workers, n, size = 8, 64, 128
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		m := registered(t, s, 2*n*size)
		wg.Go(func() {
			src := slots(t, m, 2*n, size)
			keys := keysN(fmt.Sprintf("w%d", w), n)
			for i, k := range keys {
				fill(src[i].Bytes(), k)
			}
			res := make([]store.Result, n)
			for range 20 {
				if err := s.Put(ctx, keys, src[:n], res); err != nil {
					errs <- err
					return
				}
				if err := s.Get(ctx, keys, src[n:], res); err != nil {
					errs <- err
					return
				}
				for i, r := range res {
					if r.Err != nil || !bytes.Equal(src[i].Bytes(), src[n+i].Bytes()) {
						errs <- fmt.Errorf("worker %d key %d: %+v", w, i, r)
						return
					}
				}
				if _, err := s.RemovePrefix(ctx, fmt.Sprintf("w%d/", w)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestErrorMapping(t *testing.T) {
	for _, tc := range []struct {
		e    Error
		want error
	}{
		{Error{opGet, CodeObjectNotFound}, store.ErrNotFound},
		{Error{opGet, CodeReplicaNotReady}, store.ErrNotFound},
		{Error{opExists, CodeObjectNotFound}, store.ErrNotFound},
		{Error{opPut, CodeNoAvailableHandle}, store.ErrNoSpace},
		{Error{opGet, CodeLeaseExpired}, store.ErrLeaseExpired},
		{Error{opRemove, CodeObjectHasLease}, store.ErrHasLease},
		{Error{opGet, CodeInvalidParams}, store.ErrBufferTooSmall},
		{Error{opPut, CodeInvalidParams}, store.ErrInvalidRegion},
		{Error{opRegister, CodeInvalidParams}, store.ErrInvalidRegion},
		{Error{opExists, CodeInvalidParams}, store.ErrInvalidKey},
		{Error{opPut, CodeInvalidKey}, store.ErrInvalidKey},
		{Error{opGet, CodeTransferFail}, store.ErrTransfer},
		{Error{opGet, CodeRPCFail}, store.ErrTransfer},
		{Error{opGet, CodeRPCTimeout}, store.ErrTransfer},
		{Error{opPut, CodeInternal}, store.ErrTransfer},
		{Error{opPut, -12345}, store.ErrTransfer},
		{Error{opSetup, CodeInternal}, store.ErrUnavailable},
		{Error{opCreate, CodeInternal}, store.ErrUnavailable},
	} {
		if !errors.Is(tc.e, tc.want) {
			t.Errorf("errors.Is(%v, %v) = false", tc.e, tc.want)
		}
	}
	if got, want := (Error{opGet, CodeObjectNotFound}).Error(), "mooncake: get: OBJECT_NOT_FOUND (-704)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if got, want := (Error{opPut, -12345}).Error(), "mooncake: put: code -12345"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
