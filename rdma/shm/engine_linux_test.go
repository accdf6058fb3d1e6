package shm_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/internal/shmfiles"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/rdmatest"
	"github.com/kvconnect/kvconnect/rdma/shm"
)

// newEngine starts an engine, closed at the end of the test.
func newEngine(t testing.TB, opts *shm.Options) *shm.Engine {
	t.Helper()
	e, err := shm.New(opts)
	if err != nil {
		t.Fatalf("New = %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	})
	return e
}

// alloc allocates n bytes of e's shared memory, freed at the end of the
// test, after e closes.
func alloc(t testing.TB, e *shm.Engine, n int) *shm.Memory {
	t.Helper()
	m, err := e.Alloc(n)
	if err != nil {
		t.Fatalf("Alloc(%d) = %v", n, err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
		if err := m.Free(); err != nil {
			t.Errorf("Free = %v", err)
		}
	})
	return m
}

func TestConformance(t *testing.T) {
	rdmatest.Run(t, func(t testing.TB) (rdma.Engine, rdma.Engine) {
		return newEngine(t, nil), newEngine(t, &shm.Options{Workers: 1})
	}, rdmatest.Options{Alloc: func(t testing.TB, e rdma.Engine, n int) rdma.Region {
		return alloc(t, e.(*shm.Engine), n).Region()
	}})
}

// pattern returns n bytes that depend on seed and on each byte's index.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i*131+i>>9)
	}
	return b
}

// run submits reqs in one batch of e, waits (30 s at most) and returns
// the results.
func run(t testing.TB, e rdma.Engine, reqs ...rdma.Request) []rdma.Result {
	t.Helper()
	b, err := e.NewBatch(len(reqs))
	if err != nil {
		t.Fatalf("NewBatch = %v", err)
	}
	if err := b.Submit(reqs); err != nil {
		t.Fatalf("Submit = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Wait(ctx); err != nil {
		t.Fatalf("Wait for %d requests = %v", len(reqs), err)
	}
	out := make([]rdma.Result, len(reqs))
	for i := range out {
		out[i] = b.Result(i)
	}
	if err := b.Release(); err != nil {
		t.Fatalf("Release = %v", err)
	}
	return out
}

func sub(t testing.TB, r rdma.Region, off, n int) rdma.Region {
	t.Helper()
	s, err := r.Sub(off, n)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// memfds returns the mappings and descriptors, in every process this user
// can read, of an rdma/shm memory file of process pid.
func memfds(t testing.TB, pid int) []string {
	t.Helper()
	out, err := shmfiles.Of(pid)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestOwnerOnly checks that a segment file has mode 0600, so that no
// other user can open it even through /proc, and that it is sealed.
func TestOwnerOnly(t *testing.T) {
	e := newEngine(t, nil)
	m := alloc(t, e, 8192)
	fds, err := filepath.Glob("/proc/self/fd/*")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, fd := range fds {
		l, err := os.Readlink(fd)
		if err != nil || !strings.HasPrefix(l, fmt.Sprintf("/memfd:kvconnect-shm-%d ", os.Getpid())) {
			continue
		}
		found++
		fi, err := os.Stat(fd)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o600 {
			t.Errorf("segment file %s (%s) has mode %v, want -rw------- (0600)", fd, l, perm)
		}
		if fi.Size() != int64(m.Len()) {
			t.Errorf("segment file %s is %d bytes, want %d", fd, fi.Size(), m.Len())
		}
		// Sealed: it cannot shrink under a peer's mapping.
		f, err := os.OpenFile(fd, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(0); !errors.Is(err, syscall.EPERM) {
			t.Errorf("truncating segment file %s = %v, want EPERM (sealed)", fd, err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if found != 1 {
		t.Fatalf("found %d segment files of this process in /proc/self/fd, want 1 (the Memory's)", found)
	}
	if err := m.Free(); err != nil {
		t.Fatal(err)
	}
	if left := memfds(t, os.Getpid()); len(left) > 0 {
		t.Errorf("after Free, segment files of this process are still held:\n%s", strings.Join(left, "\n"))
	}
}

func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts shm.Options
		want string
	}{
		{"long name", shm.Options{Name: strings.Repeat("n", 108)}, `Options.Name "` + strings.Repeat("n", 108) + `" is 108 bytes, want at most 107`},
		{"NUL", shm.Options{Name: "a\x00b"}, `Options.Name "a\x00b" holds a NUL byte`},
		{"slash", shm.Options{Name: "a/b"}, `Options.Name "a/b" holds a NUL byte or a slash`},
		{"workers", shm.Options{Workers: -1}, "Options.Workers = -1, want >= 0"},
	} {
		if _, err := shm.New(&tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New(%+v) = %v, want an error saying %q", tc.name, tc.opts, err, tc.want)
		}
	}
	e := newEngine(t, &shm.Options{Name: fmt.Sprintf("kvconnect-shm-test-%d", os.Getpid())})
	if _, err := shm.New(&shm.Options{Name: e.Segment()}); err == nil || !strings.Contains(err.Error(), strconv.Quote(e.Segment())) {
		t.Errorf("New with the name of a running engine = %v, want an error naming %q", err, e.Segment())
	}
	for _, n := range []int{0, -1} {
		if _, err := e.Alloc(n); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("size %d", n)) {
			t.Errorf("Alloc(%d) = %v, want an error naming the size", n, err)
		}
	}
	// Memory a peer process could not map.
	h, err := rdma.AllocHost(4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Free(); err != nil {
			t.Error(err)
		}
	})
	if err := e.Register(h.Region()); !errors.Is(err, shm.ErrUnsupported) || !strings.Contains(err.Error(), fmt.Sprintf("%#x", h.Region().Addr)) {
		t.Errorf("Register(anonymous memory) = %v, want ErrUnsupported naming its address", err)
	}
	m := alloc(t, e, 4096)
	if err := e.Register(m.Region()); err != nil {
		t.Fatal(err)
	}
	if err := m.Free(); !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("Free of registered memory = %v, want ErrBusy", err)
	}
	if m.Region().Len != 4096 {
		t.Errorf("a refused Free unmapped the memory: Region = %+v", m.Region())
	}
	if err := e.Unregister(m.Region()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Open(context.Background(), ""); !errors.Is(err, rdma.ErrUnknownSegment) {
		t.Errorf(`Open("") = %v, want ErrUnknownSegment`, err)
	}
}

// The child process: an engine with 1 MiB of registered shared memory,
// filled with pattern(1 MiB, 2), driven by lines on its standard input.
const childEnv = "KVCONNECT_SHM_CHILD"

const childLen = 1 << 20

// TestChild is the child process of the cross-process tests; it skips
// unless started by them.
func TestChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("the child of the cross-process tests, started by them")
	}
	e, err := shm.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := e.Alloc(childLen)
	if err != nil {
		t.Fatal(err)
	}
	copy(m.Bytes(), pattern(childLen, 2))
	if err := e.Register(m.Region()); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("READY %s %d\n", e.Segment(), m.Region().Addr)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		var reply string
		switch f[0] {
		case "CHECK": // CHECK off n seed: does [off, off+n) hold pattern(n, seed)?
			off, n, seed := atoi(f[1]), atoi(f[2]), atoi(f[3])
			reply = "OK"
			if !bytes.Equal(m.Bytes()[off:off+n], pattern(n, byte(seed))) {
				reply = "ERR the bytes differ"
			}
		case "PULL": // PULL seg addr n seed: read n bytes there, check them, write pattern(n, seed+1) at addr+n
			reply = pull(e, m, f[1], uintptr(atoi(f[2])), atoi(f[3]), byte(atoi(f[4])))
		}
		fmt.Println(reply)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Free(); err != nil {
		t.Fatal(err)
	}
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

// pull is the child's PULL: a read and a write by the child, into and
// out of the parent's memory.
func pull(e *shm.Engine, m *shm.Memory, seg string, addr uintptr, n int, seed byte) string {
	id, err := e.Open(context.Background(), seg)
	if err != nil {
		return "ERR " + err.Error()
	}
	r := m.Region()
	in, _ := r.Sub(0, n)
	out, _ := r.Sub(128<<10, n)
	copy(out.Bytes(), pattern(n, seed+1))
	b, err := e.NewBatch(2)
	if err != nil {
		return "ERR " + err.Error()
	}
	if err := b.Submit([]rdma.Request{
		{Op: rdma.Read, Local: in, Segment: id, Remote: addr},
		{Op: rdma.Write, Local: out, Segment: id, Remote: addr + uintptr(n)},
	}); err != nil {
		return "ERR " + err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Wait(ctx); err != nil {
		return "ERR " + err.Error()
	}
	for i := range 2 {
		if r := b.Result(i); r.Status != rdma.Completed || r.Bytes != int64(n) {
			return fmt.Sprintf("ERR request %d = %+v", i, r)
		}
	}
	if err := b.Release(); err != nil {
		return "ERR " + err.Error()
	}
	if !bytes.Equal(in.Bytes(), pattern(n, seed)) {
		return "ERR the bytes read differ"
	}
	return "OK"
}

// child is a running child process.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	seg  string
	addr uintptr
}

// startChild starts the child and waits (30 s at most) for its READY
// line. edit, if not nil, edits the command first.
func startChild(t *testing.T, edit func(*exec.Cmd)) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1", "-test.v=false")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	if edit != nil {
		edit(cmd)
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, in: in, out: bufio.NewScanner(outp)}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			if err := c.cmd.Process.Kill(); err != nil {
				t.Error(err)
			}
			c.cmd.Wait() // killed: its exit status says so
		}
	})
	f := strings.Fields(c.line(t, "READY"))
	if len(f) != 3 || f[0] != "READY" {
		t.Fatalf("the child's first line is %q, want READY <segment> <address>", strings.Join(f, " "))
	}
	c.seg, c.addr = f[1], uintptr(atoi(f[2]))
	return c
}

// line returns the child's next line, waiting 30 s at most.
func (c *child) line(t *testing.T, what string) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		if c.out.Scan() {
			got <- c.out.Text()
		} else {
			got <- "EOF " + fmt.Sprint(c.out.Err())
		}
	}()
	select {
	case l := <-got:
		return l
	case <-time.After(30 * time.Second):
		t.Fatalf("waited 30 s for the child's %s line", what)
		return ""
	}
}

// do sends a command to the child and fails unless it answers OK.
func (c *child) do(t *testing.T, cmd string) {
	t.Helper()
	if got := c.ask(t, cmd); got != "OK" {
		t.Fatalf("child: %s: %s", cmd, got)
	}
}

// ask sends a command to the child and returns its answer.
func (c *child) ask(t *testing.T, cmd string) string {
	t.Helper()
	if _, err := fmt.Fprintln(c.in, cmd); err != nil {
		t.Fatal(err)
	}
	return c.line(t, "answer to "+cmd)
}

// TestCrossProcess moves bytes both ways between two processes, each
// side reading and writing the other's memory, and checks every byte.
func TestCrossProcess(t *testing.T) {
	c := startChild(t, nil)
	e := newEngine(t, nil)
	m := alloc(t, e, childLen)
	if err := e.Register(m.Region()); err != nil {
		t.Fatal(err)
	}
	r := m.Region()
	seg, err := e.Open(context.Background(), c.seg)
	if err != nil {
		t.Fatalf("Open(the child's segment %q) = %v", c.seg, err)
	}
	const n = 256 << 10
	copy(m.Bytes()[n:], pattern(n, 3))
	got := run(t, e,
		// The parent reads the child's first 256 KiB and writes its
		// second 256 KiB to the child's third.
		rdma.Request{Op: rdma.Read, Local: sub(t, r, 0, n), Segment: seg, Remote: c.addr},
		rdma.Request{Op: rdma.Write, Local: sub(t, r, n, n), Segment: seg, Remote: c.addr + 2*n},
		// Outside the child's memory: fails, moves nothing.
		rdma.Request{Op: rdma.Read, Local: sub(t, r, 3*n, 64), Segment: seg, Remote: c.addr + childLen - 32},
	)
	want := []rdma.Result{{Status: rdma.Completed, Bytes: n}, {Status: rdma.Completed, Bytes: n}, {Status: rdma.Failed}}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if !bytes.Equal(m.Bytes()[:n], pattern(childLen, 2)[:n]) {
		t.Errorf("the bytes read from the child differ from its memory")
	}
	if i := bytes.IndexFunc(m.Bytes()[3*n:3*n+64], func(r rune) bool { return r != 0 }); i >= 0 {
		t.Errorf("byte %d of a failed read's destination changed", i)
	}
	c.do(t, fmt.Sprintf("CHECK %d %d 3", 2*n, n))

	// The child reads 64 KiB of the parent's and writes 64 KiB after it.
	const k = 64 << 10
	copy(m.Bytes()[3*n:], pattern(k, 4))
	c.do(t, fmt.Sprintf("PULL %s %d %d 4", e.Segment(), r.Addr+3*n, k))
	if !bytes.Equal(m.Bytes()[3*n+k:3*n+2*k], pattern(k, 5)) {
		t.Errorf("the bytes the child wrote differ from what it sent")
	}
}

// TestKilledPeer kills a child with SIGKILL while the parent has its
// memory mapped and the child has the parent's: every later request to it
// fails, and no process holds a segment file of either afterwards.
func TestKilledPeer(t *testing.T) {
	shmBefore := devShm(t)
	c := startChild(t, nil)
	pid := c.cmd.Process.Pid
	e := newEngine(t, nil)
	m := alloc(t, e, childLen)
	if err := e.Register(m.Region()); err != nil {
		t.Fatal(err)
	}
	r := m.Region()
	seg, err := e.Open(context.Background(), c.seg)
	if err != nil {
		t.Fatal(err)
	}
	read := rdma.Request{Op: rdma.Read, Local: sub(t, r, 0, 4096), Segment: seg, Remote: c.addr}
	if got := run(t, e, read); got[0].Status != rdma.Completed {
		t.Fatalf("read from the child = %+v", got[0])
	}
	copy(m.Bytes()[3<<18:], pattern(4096, 4))
	c.do(t, fmt.Sprintf("PULL %s %d %d 4", e.Segment(), r.Addr+3<<18, 4096))
	if held := memfds(t, pid); len(held) == 0 {
		t.Fatalf("the child's segment file is held by no process before the kill: the check below could not fail")
	}

	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Wait(); err == nil {
		t.Fatalf("the child exited cleanly after SIGKILL")
	}
	if got := run(t, e, read); got[0].Status != rdma.Failed {
		t.Errorf("read from a killed child = %+v, want failed", got[0])
	}
	if held := memfds(t, pid); len(held) > 0 {
		t.Errorf("after the child died, its segment files are still held:\n%s", strings.Join(held, "\n"))
	}
	// The parent's own memory: no grant of the dead child holds it.
	done := make(chan error, 1)
	go func() { done <- e.Unregister(r) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Unregister after the child died = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("waited 30 s for Unregister after the child died")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Free(); err != nil {
		t.Fatal(err)
	}
	if held := memfds(t, os.Getpid()); len(held) > 0 {
		t.Errorf("after Close and Free, this process's segment files are still held:\n%s", strings.Join(held, "\n"))
	}
	if after := devShm(t); !slicesEqual(after, shmBefore) {
		t.Errorf("/dev/shm changed: before %v, after %v", shmBefore, after)
	}
}

// devShm lists /dev/shm entries that name kvconnect, or nil where there
// is no /dev/shm.
func devShm(t *testing.T) []string {
	t.Helper()
	des, err := os.ReadDir("/dev/shm")
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range des {
		if strings.Contains(d.Name(), "kvconnect") {
			out = append(out, d.Name())
		}
	}
	return out
}

func slicesEqual(a, b []string) bool { return strings.Join(a, "\n") == strings.Join(b, "\n") }

// TestOtherUser starts the child as another user (nobody) and checks that
// neither side reaches the other's memory: each refuses the other's
// connection (SO_PEERCRED).
func TestOtherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root, to start a child process as another user (nobody, uid 65534)")
	}
	// A copy of the test binary that the other user can run.
	dir, err := os.MkdirTemp("", "kvconnect-shm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Error(err)
		}
	})
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "shm.test")
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	c := startChild(t, func(cmd *exec.Cmd) {
		cmd.Path, cmd.Args[0], cmd.Dir = exe, exe, dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	})

	refused := make(chan struct{}, 16)
	e := newEngine(t, &shm.Options{Logger: slog.New(&notify{msg: "shm: refused a peer of another user", ch: refused})})
	m := alloc(t, e, 4096)
	if err := e.Register(m.Region()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Open(context.Background(), c.seg); !errors.Is(err, rdma.ErrUnknownSegment) || !strings.Contains(err.Error(), "not of user 0") {
		t.Errorf("Open(a segment of user %d) = %v, want ErrUnknownSegment saying it is not of user 0", nobody, err)
	}
	got := c.ask(t, fmt.Sprintf("PULL %s %d %d 4", e.Segment(), m.Region().Addr, 1024))
	if !strings.HasPrefix(got, "ERR") || !strings.Contains(got, fmt.Sprintf("not of user %d", nobody)) {
		t.Errorf("the child's read of user 0's memory: %s, want an error saying the segment is not of user %d", got, nobody)
	}
	select {
	case <-refused:
	case <-time.After(30 * time.Second):
		t.Errorf("waited 30 s for the engine to log that it refused the child's connection")
	}
}

// notify is a slog.Handler that signals ch for each record whose message
// is msg.
type notify struct {
	msg string
	ch  chan struct{}
}

func (n *notify) Enabled(context.Context, slog.Level) bool { return true }
func (n *notify) Handle(_ context.Context, r slog.Record) error {
	if r.Message == n.msg {
		select {
		case n.ch <- struct{}{}:
		default:
		}
	}
	return nil
}
func (n *notify) WithAttrs([]slog.Attr) slog.Handler { return n }
func (n *notify) WithGroup(string) slog.Handler      { return n }

// TestReopen closes a peer and starts another under its name: the old
// handle fails, and Open of the name reaches the new peer under a new
// handle.
func TestReopen(t *testing.T) {
	name := fmt.Sprintf("kvconnect-shm-reopen-%d", os.Getpid())
	a := newEngine(t, nil)
	am := alloc(t, a, 4096)
	if err := a.Register(am.Region()); err != nil {
		t.Fatal(err)
	}
	local := sub(t, am.Region(), 0, 64)
	peer := func(fill byte) (*shm.Engine, uintptr) {
		e := newEngine(t, &shm.Options{Name: name})
		m := alloc(t, e, 4096)
		copy(m.Bytes(), bytes.Repeat([]byte{fill}, 4096))
		if err := e.Register(m.Region()); err != nil {
			t.Fatal(err)
		}
		return e, m.Region().Addr
	}
	b, baddr := peer(1)
	old, err := a.Open(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, a, rdma.Request{Op: rdma.Read, Local: local, Segment: old, Remote: baddr}); got[0].Status != rdma.Completed || am.Bytes()[0] != 1 {
		t.Fatalf("read from the first peer = %+v, byte %d", got[0], am.Bytes()[0])
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	_, caddr := peer(2)
	if got := run(t, a, rdma.Request{Op: rdma.Read, Local: local, Segment: old, Remote: caddr}); got[0].Status != rdma.Failed {
		t.Errorf("read through the closed peer's handle = %+v, want failed", got[0])
	}
	seg, err := a.Open(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if seg == old {
		t.Errorf("Open after the peer closed = the old handle %d, want a new one", seg)
	}
	if got := run(t, a, rdma.Request{Op: rdma.Read, Local: local, Segment: seg, Remote: caddr}); got[0].Status != rdma.Completed || am.Bytes()[0] != 2 {
		t.Errorf("read from the new peer = %+v, byte %d, want completed, 2", got[0], am.Bytes()[0])
	}
	if err := a.CloseSegment(old); err != nil {
		t.Errorf("CloseSegment(the old handle) = %v", err)
	}
}
