package remote_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/remote"
)

// bound is how long a test waits for something that should happen soon:
// generous, as the machine may be busy; only a hang takes that long.
const bound = time.Minute

// host returns n bytes of host memory, freed when t ends.
func host(t testing.TB, n int) *rdma.HostMemory {
	t.Helper()
	m, err := rdma.AllocHost(n)
	if errors.Is(err, rdma.ErrUnsupported) {
		t.Skipf("needs host memory: %v", err)
	}
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

func sub(t testing.TB, r rdma.Region, off, n int) rdma.Region {
	t.Helper()
	s, err := r.Sub(off, n)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fill writes the value of key i into b: bytes that differ with i and
// with the position.
func fill(b []byte, i int) {
	x := uint32(i)*2654435761 + 1
	for j := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[j] = byte(x)
	}
}

// gate is a store whose Get and RemovePrefix, once armed, block until
// their context ends, after RemovePrefix removed what it names: a call
// the server is running when the test acts.
type gate struct {
	store.Store
	entered chan struct{} // closed when a gated call starts
	once    sync.Once
}

func newGate(s store.Store) *gate { return &gate{Store: s, entered: make(chan struct{})} }

func (g *gate) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	g.once.Do(func() { close(g.entered) })
	<-ctx.Done()
	return ctx.Err()
}

func (g *gate) RemovePrefix(ctx context.Context, prefix string) (int, error) {
	n, err := g.Store.RemovePrefix(ctx, prefix)
	if err != nil {
		return n, err
	}
	g.once.Do(func() { close(g.entered) })
	<-ctx.Done()
	return n, ctx.Err()
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(bound):
		t.Fatalf("%s: not after %v", what, bound)
	}
}

func newMemstore(t testing.TB) *memstore.Store {
	t.Helper()
	return newMemstoreOf(t, 16<<20)
}

func newMemstoreOf(t testing.TB, capacity int64) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func dial(t testing.TB, path string, opts remote.ClientOptions) remote.Client {
	t.Helper()
	c, err := remote.Dial(context.Background(), "unix", path, opts)
	if err != nil {
		t.Fatalf("Dial(unix, %s) = %v", path, err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("client Close() = %v", err)
		}
	})
	return c
}

// TestServerClosedMidCall closes the server while it runs a Get: the
// call ends, every key failed with store.ErrTransfer; a server started
// again on the same path serves the client's next call.
func TestServerClosedMidCall(t *testing.T) {
	inner := newMemstore(t)
	g := newGate(inner)
	path := filepath.Join(t.TempDir(), "kv.sock")
	srv, err := remote.NewServer(g, remote.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := remote.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	c := dial(t, path, remote.ClientOptions{Conns: 2})

	mem := host(t, 64<<10)
	if err := c.Register(mem.Region()); err != nil {
		t.Fatal(err)
	}
	src, dst := sub(t, mem.Region(), 0, 4096), sub(t, mem.Region(), 32<<10, 4096)
	fill(src.Bytes(), 1)
	res := make([]store.Result, 3)
	keys := []string{"k/1", "k/2", "k/3"}
	if err := c.Put(context.Background(), keys[:1], []rdma.Region{src}, res[:1]); err != nil || res[0].Err != nil {
		t.Fatalf("Put(k/1) = %v, %v", err, res[0].Err)
	}

	done := make(chan struct{})
	var getErr error
	go func() {
		defer close(done)
		getErr = c.Get(context.Background(), keys, []rdma.Region{dst, dst, dst}, res)
	}()
	waitClosed(t, g.entered, "the server's Get")
	if err := srv.Close(); err != nil {
		t.Fatalf("server Close() = %v", err)
	}
	waitClosed(t, done, "the client's Get after the server closed")
	if getErr != nil {
		t.Fatalf("Get with the server closed mid-call = %v, want per-key errors", getErr)
	}
	for i, r := range res {
		if !errors.Is(r.Err, store.ErrTransfer) || r.N != 0 {
			t.Errorf("Get(%q) with the server closed mid-call = %+v, want N 0 and store.ErrTransfer", keys[i], r)
		}
	}
	if err := <-served; !errors.Is(err, remote.ErrServerClosed) {
		t.Errorf("Serve() = %v, want %v", err, remote.ErrServerClosed)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket after the server closed: Lstat = %v, want not exist", err)
	}

	// The server comes back on the same path, over the same store (in a
	// wrapper that, as the gate, is no store.Leaser: a client refuses a
	// server that changed its declaration).
	start(t, struct{ store.Store }{inner}, remote.ServerOptions{}, path)
	clear(dst.Bytes())
	if err := c.Get(context.Background(), keys[:1], []rdma.Region{dst}, res[:1]); err != nil || res[0].Err != nil {
		t.Fatalf("Get(k/1) after the server came back = %v, %v; want the value", err, res[0].Err)
	}
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Errorf("Get(k/1) after the server came back: the bytes differ from the value put")
	}
}

// TestUnreachable: a client whose server is gone fails each key with
// store.ErrTransfer, and Dial of an address nobody serves fails with
// store.ErrUnavailable naming it.
func TestUnreachable(t *testing.T) {
	s := serve(t, memstore.Config{Capacity: 1 << 20}, remote.ServerOptions{}, remote.ClientOptions{})
	if err := s.srv.Close(); err != nil {
		t.Fatal(err)
	}
	res := make([]store.Result, 2)
	if err := s.client.Exists(context.Background(), []string{"a", "b"}, res); err != nil {
		t.Fatalf("Exists with the server gone = %v, want per-key errors", err)
	}
	for _, r := range res {
		if !errors.Is(r.Err, store.ErrTransfer) {
			t.Errorf("Exists with the server gone: %v, want store.ErrTransfer", r.Err)
		}
	}
	_, err := remote.Dial(context.Background(), "unix", s.path, remote.ClientOptions{})
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), s.path) {
		t.Errorf("Dial(unix, %s) with no server = %v, want store.ErrUnavailable naming the path", s.path, err)
	}
}

// TestCancelMidCall cancels calls while the server runs them: the server
// is told, cancels its store's call, and answers with what it did.
func TestCancelMidCall(t *testing.T) {
	inner := newMemstore(t)
	path := filepath.Join(t.TempDir(), "kv.sock")
	g := newGate(inner)
	start(t, g, remote.ServerOptions{}, path)
	c := dial(t, path, remote.ClientOptions{Conns: 1})
	mem := host(t, 64<<10)
	if err := c.Register(mem.Region()); err != nil {
		t.Fatal(err)
	}
	keys := []string{"p/1", "p/2", "p/3", "q/1"}
	srcs := make([]rdma.Region, len(keys))
	for i := range keys {
		srcs[i] = sub(t, mem.Region(), i*4096, 4096)
		fill(srcs[i].Bytes(), i)
	}
	res := make([]store.Result, len(keys))
	if err := c.Put(context.Background(), keys, srcs, res); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	var n int
	var err error
	go func() {
		defer close(done)
		n, err = c.RemovePrefix(ctx, "p/")
	}()
	waitClosed(t, g.entered, "the server's RemovePrefix")
	cancel()
	waitClosed(t, done, "RemovePrefix after its context was canceled")
	if n != 3 || !errors.Is(err, context.Canceled) {
		t.Errorf("RemovePrefix(p/) canceled after it removed 3 keys = %d, %v; want 3, context.Canceled", n, err)
	}
	if err := c.Exists(context.Background(), keys, res); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if want := i == 3; (r.Err == nil) != want {
			t.Errorf("Exists(%q) after RemovePrefix(p/) = %v, want present %v", keys[i], r.Err, want)
		}
	}
}

// TestKilledClient runs a child process that puts values in a loop, and
// kills it (SIGKILL): once at whatever point of its loop it has reached
// after storing five batches, and once in the middle of a put's frame,
// through a proxy that forwards its bytes to the server and kills it half
// way through the sixth batch's values. The server keeps serving, every
// value stored is whole, and the torn batch stores nothing.
func TestKilledClient(t *testing.T) {
	if path := os.Getenv(childEnv); path != "" {
		putForever(t, path)
		return
	}
	t.Run("Loop", func(t *testing.T) {
		inner := newMemstoreOf(t, 64<<20)
		path := filepath.Join(t.TempDir(), "kv.sock")
		logs := make(remote.Endings, 16)
		start(t, inner, remote.ServerOptions{Logger: slog.New(logs)}, path)
		cmd, lines := child(t, path)
		timer := time.NewTimer(bound)
		defer timer.Stop()
		for started := 0; started < 6; {
			select {
			case n, ok := <-lines:
				if !ok {
					t.Fatalf("the child ended after starting %d batches: %v", started, cmd.Wait())
				}
				started = n
			case <-timer.C:
				t.Fatalf("the child started %d batches in %v, want 6", started, bound)
			}
		}
		kill(t, cmd, lines)
		ended := waitEnded(t, logs)
		checked := checkWhole(t, path, inner)
		if checked < 5*childBatch {
			t.Errorf("%d values read back whole, want the %d of the five batches the child stored", checked, 5*childBatch)
		}
		t.Logf("%d values read back whole; the child's connection ended with %v", checked, ended)
	})
	t.Run("MidFrame", func(t *testing.T) {
		inner := newMemstoreOf(t, 64<<20)
		dir := t.TempDir()
		path, proxy := filepath.Join(dir, "kv.sock"), filepath.Join(dir, "proxy.sock")
		logs := make(remote.Endings, 16)
		start(t, inner, remote.ServerOptions{Logger: slog.New(logs)}, path)
		pl, err := remote.Listen("unix", proxy)
		if err != nil {
			t.Fatal(err)
		}
		defer pl.Close()
		// Five whole batches and half of the sixth's values; the frames'
		// headers and fields take a few hundred bytes more.
		threshold := 0
		for i := range 5 * childBatch {
			threshold += childSize(i)
		}
		threshold += childBatch * childValue / 2
		cmd, lines := child(t, proxy)
		accepted := make(chan net.Conn, 1)
		go func() {
			nc, err := pl.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- nc
		}()
		var nc net.Conn
		select {
		case nc = <-accepted:
		case <-time.After(bound):
			t.Fatalf("the child did not connect in %v", bound)
		}
		if nc == nil {
			t.Fatal("proxy accept failed")
		}
		defer nc.Close()
		up, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() { io.Copy(nc, up) }) // replies; ends when up is closed
		if _, err := io.CopyN(up, nc, int64(threshold)); err != nil {
			t.Fatalf("forwarding the child's first %d bytes: %v", threshold, err)
		}
		kill(t, cmd, lines)
		if err := up.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		ended := waitEnded(t, logs)
		if !errors.Is(ended, io.ErrUnexpectedEOF) {
			t.Errorf("the server ended the killed child's connection with %v, want a torn frame (%v)", ended, io.ErrUnexpectedEOF)
		}
		if checked := checkWhole(t, path, inner); checked != 5*childBatch {
			t.Errorf("%d values read back whole, want the %d of the five whole batches and none of the torn one", checked, 5*childBatch)
		}
	})
}

// child starts the test binary as a child that puts values through the
// socket at path until killed, and returns it and a channel that counts
// the lines it prints, one before each batch it puts.
func child(t *testing.T, path string) (*exec.Cmd, <-chan int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledClient$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan int)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for n := 1; sc.Scan(); n++ {
			lines <- n
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill() // the test failed before it killed the child
			_ = cmd.Wait()
		}
	})
	return cmd, lines
}

// kill kills the child with SIGKILL and reaps it.
func kill(t *testing.T, cmd *exec.Cmd, lines <-chan int) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for range lines {
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("the child exited cleanly, want killed")
	}
}

// waitEnded returns the error with which the server ended a connection.
func waitEnded(t *testing.T, logs remote.Endings) error {
	t.Helper()
	select {
	case err := <-logs:
		return err
	case <-time.After(bound):
		t.Fatalf("the server did not end the killed child's connection in %v", bound)
		return nil
	}
}

// checkWhole reads back, through a new client, every key the child may
// have stored, checks that each value present is whole, and returns how
// many there are; the store must hold no other key.
func checkWhole(t *testing.T, path string, inner *memstore.Store) int {
	t.Helper()
	c := dial(t, path, remote.ClientOptions{})
	mem := host(t, 2*childValue)
	if err := c.Register(mem.Region()); err != nil {
		t.Fatal(err)
	}
	dst := sub(t, mem.Region(), 0, childValue)
	want := sub(t, mem.Region(), childValue, childValue)
	res := make([]store.Result, 1)
	checked := 0
	st := inner.Stats()
	for i := 0; i < int(st.Puts+st.RejectedPuts)+childBatch*4; i++ {
		k := childKey(i)
		if err := c.Get(context.Background(), []string{k}, []rdma.Region{dst}, res); err != nil {
			t.Fatal(err)
		}
		if errors.Is(res[0].Err, store.ErrNotFound) {
			continue
		}
		if res[0].Err != nil {
			t.Fatalf("Get(%q) = %v", k, res[0].Err)
		}
		n := childSize(i)
		fill(want.Bytes()[:n], i)
		if res[0].N != n || !bytes.Equal(dst.Bytes()[:n], want.Bytes()[:n]) {
			t.Errorf("Get(%q) = %d bytes that are not the %d-byte value put", k, res[0].N, n)
		}
		checked++
	}
	if st := inner.Stats(); int64(checked) != st.Keys || st.Evictions != 0 {
		t.Errorf("%d values read back, but the store holds %d keys and evicted %d", checked, st.Keys, st.Evictions)
	}
	return checked
}

const (
	childEnv   = "KVCONNECT_REMOTE_TEST_PUTTER"
	childValue = 1 << 20
	childBatch = 4
)

func childKey(i int) string { return fmt.Sprintf("kill/%06d", i) }
func childSize(i int) int   { return childValue - (i%7)*4096 }

// putForever is the child of TestKilledClient: it puts values until it is
// killed.
func putForever(t *testing.T, path string) {
	c, err := remote.Dial(context.Background(), "unix", path, remote.ClientOptions{Conns: 1})
	if err != nil {
		t.Fatal(err)
	}
	mem := host(t, childBatch*childValue)
	if err := c.Register(mem.Region()); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, childBatch)
	srcs := make([]rdma.Region, childBatch)
	res := make([]store.Result, childBatch)
	for i := 0; ; i += childBatch {
		for j := range keys {
			keys[j] = childKey(i + j)
			srcs[j] = sub(t, mem.Region(), j*childValue, childSize(i+j))
			fill(srcs[j].Bytes(), i+j)
		}
		fmt.Println(i)
		if err := c.Put(context.Background(), keys, srcs, res); err != nil {
			t.Fatal(err)
		}
		for j, r := range res {
			if r.Err != nil {
				t.Fatalf("Put(%q) = %v", keys[j], r.Err)
			}
		}
	}
}

// TestListen checks the socket Listen makes: mode 0600, and what it
// refuses to replace.
func TestListen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kv.sock")
	l, err := remote.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("Listen(unix, %s) made mode %v, want a socket of mode 0600", path, fi.Mode())
	}
	if a := l.Addr(); a.Network() != "unix" || a.String() != path {
		t.Errorf("Listen(unix, %s).Addr() = %s %s, want unix %s", path, a.Network(), a, path)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("the directory holds %d entries after Listen, want only the socket", len(entries))
	}
	var accepting sync.WaitGroup
	defer accepting.Wait()
	live := l
	accepting.Go(func() {
		for {
			nc, err := live.Accept()
			if err != nil {
				return
			}
			nc.Close()
		}
	})
	if _, err := remote.Listen("unix", path); err == nil || !strings.Contains(err.Error(), "a server listens there") {
		t.Errorf("Listen(unix, %s) over a live socket = %v, want refused", path, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket after Close: Lstat = %v, want not exist", err)
	}

	// A socket nobody serves is replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	if err := stale.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = remote.Listen("unix", path)
	if err != nil {
		t.Fatalf("Listen(unix, %s) over a stale socket = %v, want it replaced", path, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// A file that is not a socket is refused, and left as it was.
	file := filepath.Join(dir, "data")
	if err := os.WriteFile(file, []byte("user data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Listen("unix", file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen(unix, %s) over a regular file = %v, want refused", file, err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "user data" {
		t.Errorf("the file after Listen refused it = %q, %v; want it unchanged", b, err)
	}
}

// TestListenConcurrent races two Listens for one path, many times: one
// gets the socket, and the other is refused with an error naming the
// path, never both served with one of the sockets unreachable.
func TestListenConcurrent(t *testing.T) {
	dir := t.TempDir()
	for i := range 50 {
		path := filepath.Join(dir, fmt.Sprintf("kv%d.sock", i))
		var ls [2]net.Listener
		var errs [2]error
		var wg sync.WaitGroup
		start := make(chan struct{})
		for j := range 2 {
			wg.Go(func() {
				<-start
				ls[j], errs[j] = remote.Listen("unix", path)
			})
		}
		close(start)
		wg.Wait()
		won := -1
		for j := range 2 {
			if errs[j] == nil {
				defer ls[j].Close()
				if won >= 0 {
					t.Fatalf("round %d: both Listen(unix, %s) succeeded: one's socket was replaced by the other's", i, path)
				}
				won = j
			} else if !strings.Contains(errs[j].Error(), path) || !strings.Contains(errs[j].Error(), "a server listens there") {
				t.Errorf("round %d: the refused Listen(unix, %s) = %v, want an error naming the path and the live socket there", i, path, errs[j])
			}
		}
		if won < 0 {
			t.Fatalf("round %d: both Listen(unix, %s) failed: %v", i, path, errors.Join(errs[:]...))
		}
		nc, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("round %d: dial the winner's socket: %v", i, err)
		}
		got, err := ls[won].Accept()
		if err != nil {
			t.Fatalf("round %d: the winner's Accept: %v", i, err)
		}
		got.Close()
		nc.Close()
	}
}

// TestBadInput checks that bad input gets an error naming the field and
// the value, found on the client without a round trip.
func TestBadInput(t *testing.T) {
	s := serve(t, memstore.Config{Capacity: 1 << 20}, remote.ServerOptions{MaxValue: 8192}, remote.ClientOptions{})
	c := s.client
	mem := host(t, 64<<10)
	if err := c.Register(sub(t, mem.Region(), 0, 32<<10)); err != nil {
		t.Fatal(err)
	}
	in := sub(t, mem.Region(), 0, 4096)
	big := sub(t, mem.Region(), 0, 8193)
	out := sub(t, mem.Region(), 40<<10, 4096)
	dev := rdma.Region{Addr: 0x10000, Len: 4096, Loc: rdma.Device(0)}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func(res []store.Result) error
		want error
		text []string
	}{
		{"UnregisteredSource", func(res []store.Result) error { return c.Put(ctx, []string{"k"}, []rdma.Region{out}, res) },
			store.ErrInvalidRegion, []string{`"k"`, fmt.Sprintf("%#x", out.Addr), "not inside a registered region"}},
		{"DeviceDestination", func(res []store.Result) error { return c.Get(ctx, []string{"k"}, []rdma.Region{dev}, res) },
			store.ErrInvalidRegion, []string{`"k"`, "cuda:0", "host memory"}},
		{"ValueOverMaxValue", func(res []store.Result) error { return c.Put(ctx, []string{"k"}, []rdma.Region{big}, res) },
			store.ErrInvalidRegion, []string{`"k"`, "8193 bytes", "MaxValue 8192"}},
		{"KeyWithSpace", func(res []store.Result) error { return c.Exists(ctx, []string{"a key"}, res) },
			store.ErrInvalidKey, []string{`"a key"`}},
		{"EmptySourceList", func(res []store.Result) error { return c.PutV(ctx, []string{"k"}, [][]rdma.Region{{}}, res) },
			store.ErrInvalidRegion, []string{`"k"`, "no source regions"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := make([]store.Result, 1)
			if err := tc.call(res); err != nil {
				t.Fatalf("call = %v, want a per-key error", err)
			}
			err := res[0].Err
			if !errors.Is(err, tc.want) {
				t.Fatalf("key error = %v, want %v", err, tc.want)
			}
			for _, s := range tc.text {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("key error %q does not name %s", err, s)
				}
			}
		})
	}
	if st := s.inner.Stats(); st.Exists != 0 || st.Puts != 0 || st.Hits+st.Misses != 0 {
		t.Errorf("the served store saw calls for bad input: %+v", st)
	}
	if err := c.Register(dev); !errors.Is(err, store.ErrInvalidRegion) || !strings.Contains(err.Error(), "cuda:0") {
		t.Errorf("Register(%v) = %v, want store.ErrInvalidRegion naming the location", dev, err)
	}
	if err := c.Register(in); !errors.Is(err, store.ErrInvalidRegion) || !strings.Contains(err.Error(), "overlaps") {
		t.Errorf("Register(%v) inside a registered region = %v, want store.ErrInvalidRegion saying it overlaps", in, err)
	}

	for _, tc := range []struct {
		opts remote.ServerOptions
		want string
	}{
		{remote.ServerOptions{MaxValue: -1}, "MaxValue -1"},
		{remote.ServerOptions{MaxBatch: -3}, "MaxBatch -3"},
		{remote.ServerOptions{MaxValue: 1 << 20, MaxCallBytes: 1 << 10}, "MaxCallBytes 1024"},
		{remote.ServerOptions{MaxConns: -1}, "MaxConns -1"},
	} {
		if _, err := remote.NewServer(s.inner, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewServer(%+v) = %v, want an error naming %s", tc.opts, err, tc.want)
		}
	}
	for _, tc := range []struct {
		opts remote.ClientOptions
		want string
	}{
		{remote.ClientOptions{Conns: -2}, "Conns -2"},
		{remote.ClientOptions{CallTimeout: -time.Second}, "CallTimeout -1s"},
		{remote.ClientOptions{CancelWait: -time.Second}, "CancelWait -1s"},
	} {
		if _, err := remote.Dial(ctx, "unix", s.path, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Dial(%+v) = %v, want an error naming %s", tc.opts, err, tc.want)
		}
	}
}

// TestSplit puts and gets a batch larger than the server's limits, which
// the client splits into several requests.
func TestSplit(t *testing.T) {
	s := serve(t, memstore.Config{Capacity: 4 << 20}, remote.ServerOptions{MaxValue: 4096, MaxBatch: 3, MaxCallBytes: 10000}, remote.ClientOptions{})
	const n = 17
	mem := host(t, 2*n*4096)
	if err := s.client.Register(mem.Region()); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, n)
	src := make([]rdma.Region, n)
	dst := make([]rdma.Region, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("split/%02d", i)
		src[i] = sub(t, mem.Region(), i*4096, 1000+i*150)
		fill(src[i].Bytes(), i)
		dst[i] = sub(t, mem.Region(), (n+i)*4096, 4096)
	}
	res := make([]store.Result, n)
	if err := s.client.Put(context.Background(), keys, src, res); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.N != src[i].Len {
			t.Errorf("Put(%q) = %+v, want N %d", keys[i], r, src[i].Len)
		}
	}
	if err := s.client.Get(context.Background(), keys, dst, res); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.N != src[i].Len || !bytes.Equal(dst[i].Bytes()[:r.N], src[i].Bytes()) {
			t.Errorf("Get(%q) = %+v, want its %d-byte value", keys[i], r, src[i].Len)
		}
	}
	if st := s.client.Stats(); st.Puts != n || st.Hits != n || st.Keys != n {
		t.Errorf("Stats() = %+v, want %d keys, puts and hits", st, n)
	}
}
