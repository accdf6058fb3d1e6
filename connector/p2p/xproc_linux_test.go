//go:build linux

package p2p_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/p2p"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/internal/shmfiles"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/mooncake"
	"github.com/kvconnect/kvconnect/rdma/shm"
)

// The child process of the cross-process tests: xprocRoleEnv selects its
// part, xprocTransferEnv its transfer engine.
const (
	xprocRoleEnv     = "KVCONNECT_P2P_XPROC_ROLE"
	xprocTransferEnv = "KVCONNECT_P2P_XPROC_TRANSFER"
)

// The child's parts.
const (
	roleConsume = "consume" // a consumer that loads one request and checks it
	roleHold    = "hold"    // a consumer that reaches into the producer's memory, then waits to be killed
	roleProduce = "produce" // a producer that offers one request, then waits to be killed
)

// xprocLine prefixes the lines of the protocol between the processes on
// the child's stdout, which the test framework writes to as well.
const xprocLine = "XPROC "

// xprocMsg is a line of the protocol, either way.
type xprocMsg struct {
	Ready  bool             `json:"ready,omitempty"`  // the child opened its instance
	Params []byte           `json:"params,omitempty"` // the producer's transfer parameters
	Tokens []hashing.Token  `json:"tokens,omitempty"` // the request's prompt
	Sums   map[int][]string `json:"sums,omitempty"`   // consumer: per rank, the SHA-256 of each loaded block
	Held   bool             `json:"held,omitempty"`   // the child holds the producer's memory mapped
	Err    string           `json:"err,omitempty"`
}

// xprocIdentity is the identity both processes give their instances.
func xprocIdentity() hashing.Identity {
	return hashing.Identity{
		Tenant: "acme", Model: "m", WeightsVersion: "v1",
		Format: hashing.Format{Device: "cpu", ModelDType: "bf16", KVDType: "bf16"},
		Layout: hashing.Layout{Layers: 2, KVHeads: 4, HeadDim: 8, BlockSize: 4, TPSize: 2, Replication: 1},
	}
}

// xprocTokens is the prompt of the cross-process tests: 6 blocks of 4,
// of which a consumer loads the first 5 (the last token is computed).
func xprocTokens() []hashing.Token {
	tokens := make([]hashing.Token, 6*4)
	for i := range tokens {
		tokens[i] = hashing.Token(7000 + 5*i)
	}
	return tokens
}

// xprocExtra is the kv_connector_extra_config of the tests' instances.
func xprocExtra(kind, keep string) map[string]any {
	return map[string]any{"transfer": kind, "keep_timeout": keep, "open_timeout": "5s", "close_timeout": "30s"}
}

// TestXprocChild is the child process of the cross-process tests; it
// skips unless started by them.
func TestXprocChild(t *testing.T) {
	role := os.Getenv(xprocRoleEnv)
	if role == "" {
		t.Skip("the child of the cross-process tests, started by them")
	}
	kind := os.Getenv(xprocTransferEnv)
	out := func(m xprocMsg) {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("%s%s\n", xprocLine, b)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 1<<20)
	read := func() xprocMsg {
		if !in.Scan() {
			t.Fatalf("stdin closed: %v", in.Err())
		}
		var m xprocMsg
		if err := json.Unmarshal(in.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	switch role {
	case roleProduce:
		prod := openInstanceExtra(t, xprocIdentity(), connector.RoleProducer, "xproc-prefill", xprocExtra(kind, "10m"))
		out(xprocMsg{Ready: true, Params: prefill(t, prod, xprocTokens(), []connector.BlockID{3, 4, 5, 6, 7, 8}), Tokens: xprocTokens()})
		io.Copy(io.Discard, os.Stdin) // until killed
		return
	case roleConsume, roleHold:
	default:
		t.Fatalf("%s = %q", xprocRoleEnv, role)
	}
	cons := openInstanceExtra(t, xprocIdentity(), connector.RoleConsumer, "xproc-decode", xprocExtra(kind, "10m"))
	out(xprocMsg{Ready: true})
	m := read()
	if role == roleHold {
		out(hold(t, cons, m.Params))
		io.Copy(io.Discard, os.Stdin) // until killed
		return
	}
	hashes, err := hashing.HashBlocks(4, m.Tokens)
	if err != nil {
		t.Fatal(err)
	}
	req := &connector.Request{ID: "r", Prompt: len(m.Tokens), Hashes: hashes, TransferParams: m.Params}
	res := xprocMsg{Sums: map[int][]string{}}
	defer func() { out(res) }()
	fail := func(format string, args ...any) {
		res.Err = fmt.Sprintf(format, args...)
		t.Error(res.Err)
	}
	match, err := cons.sched.Match(req, 0)
	if err != nil || match.Tokens != 5*4 {
		fail("consumer Match = %+v, %v; want 20 tokens", match, err)
		return
	}
	cblocks := []connector.BlockID{10, 11, 12, 13, 14, 15}
	if err := cons.sched.Allocated(req, match.Tokens, cblocks); err != nil {
		fail("consumer Allocated: %v", err)
		return
	}
	var failed []connector.LoadFailure
	cons.until(t, "the consumer's load", func(p *connector.Progress) bool {
		failed = append(failed, p.Failed...)
		return len(failed) > 0 || slices.Contains(p.Loaded, "r")
	})
	if len(failed) > 0 {
		fail("load failed: %+v", failed)
		return
	}
	for rank := range cons.kv {
		for i, b := range cblocks[:5] {
			for s, sp := range cons.kv[rank].Spans(nil, b) {
				for j, got := range sp.Bytes() {
					if want := kvByte(rank, i, s, j); got != want {
						fail("rank %d: block %d (the prompt's %d), span %d, byte %d = %#x, want %#x", rank, b, i, s, j, got, want)
						return
					}
				}
			}
			sum := sha256.Sum256(cons.block(rank, b))
			res.Sums[rank] = append(res.Sums[rank], hex.EncodeToString(sum[:]))
		}
		last := cons.block(rank, cblocks[5])
		if !slices.Equal(last, make([]byte, len(last))) {
			fail("rank %d: the block with the last prompt token was written", rank)
			return
		}
	}
	if keep, err := cons.sched.Finish(req, cblocks); err != nil || keep {
		fail("consumer Finish = %v, %v; want false", keep, err)
	}
}

// hold has rank 0's transfer engine of consumer cons read the offer word
// of the producer's mailbox slot from params, as a load does first, so
// that the producer's memory is mapped in this process (shm) or its
// segment open.
func hold(t *testing.T, cons *instance, params []byte) xprocMsg {
	p, err := p2p.DecodeParams(params)
	if err != nil {
		return xprocMsg{Err: err.Error()}
	}
	e := cons.workers[0].(*p2p.Worker).Engine()
	var local rdma.Region
	if se, ok := e.(*shm.Engine); ok {
		m, err := se.Alloc(4096)
		if err != nil {
			return xprocMsg{Err: err.Error()}
		}
		cons.free = append(cons.free, m.Free)
		local = m.Region()
	} else {
		m, err := rdma.AllocHost(4096)
		if err != nil {
			return xprocMsg{Err: err.Error()}
		}
		cons.free = append(cons.free, m.Free)
		local = m.Region()
	}
	if err := e.Register(local); err != nil {
		return xprocMsg{Err: err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seg, err := e.Open(ctx, p.Ranks[0].Segment)
	if err != nil {
		return xprocMsg{Err: err.Error()}
	}
	b, err := e.NewBatch(1)
	if err != nil {
		return xprocMsg{Err: err.Error()}
	}
	local.Len = 16
	if err := b.Submit([]rdma.Request{{Op: rdma.Read, Local: local, Segment: seg, Remote: uintptr(p.Ranks[0].Mailbox) + 64 + uintptr(64*p.Slot)}}); err != nil {
		return xprocMsg{Err: err.Error()}
	}
	if err := b.Wait(ctx); err != nil {
		return xprocMsg{Err: err.Error()}
	}
	if r := b.Result(0); r.Status != rdma.Completed {
		return xprocMsg{Err: fmt.Sprintf("reading the offer word: %+v", r)}
	}
	if err := b.Release(); err != nil {
		return xprocMsg{Err: err.Error()}
	}
	return xprocMsg{Held: true}
}

// xchild is a running child process of the cross-process tests.
type xchild struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

// startXchild starts the child in role over the transfer engine kind.
func startXchild(t *testing.T, role, kind string) *xchild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestXprocChild$", "-test.count=1", "-test.v=true")
	cmd.Env = append(os.Environ(), xprocRoleEnv+"="+role, xprocTransferEnv+"="+kind)
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
	c := &xchild{cmd: cmd, in: in, lines: make(chan string, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c.lines)
		sc := bufio.NewScanner(outp)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), xprocLine); ok {
				c.lines <- l
			} else {
				t.Logf("child: %s", sc.Text())
			}
		}
	}()
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.in.Close()
			if err := c.wait(); err != nil {
				t.Errorf("child: %v", err)
			}
		}
		<-done
	})
	return c
}

// wait waits (a minute at most) for the child to exit, then kills it.
func (c *xchild) wait() error {
	exited := make(chan error, 1)
	go func() { exited <- c.cmd.Wait() }()
	select {
	case err := <-exited:
		return err
	case <-time.After(time.Minute):
		c.cmd.Process.Kill()
		<-exited
		return fmt.Errorf("did not exit within a minute of its stdin closing: killed")
	}
}

// kill kills the child with SIGKILL and waits for it.
func (c *xchild) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Wait(); err == nil {
		t.Fatalf("the child exited cleanly after SIGKILL")
	}
}

// recv returns the child's next message, waiting a minute at most.
func (c *xchild) recv(t *testing.T, what string) xprocMsg {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatalf("the child's output ended before %s", what)
		}
		var m xprocMsg
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("the child's %s: %v", what, err)
		}
		if m.Err != "" {
			t.Fatalf("the child's %s: %s", what, m.Err)
		}
		return m
	case <-time.After(time.Minute):
		t.Fatalf("waited a minute for the child's %s", what)
		return xprocMsg{}
	}
}

func (c *xchild) send(t *testing.T, m xprocMsg) {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(c.in, "%s\n", b); err != nil {
		t.Fatal(err)
	}
}

// xprocKinds returns the transfer engines the cross-process tests run
// over: shm, and mooncake, which needTransfer skips unless
// MOONCAKE_TRANSFER_ENGINE_LIBRARY is set.
func xprocKinds() []string {
	return []string{p2p.TransferShm, p2p.TransferMooncake}
}

// needTransfer skips the mooncake variant without a real Transfer Engine,
// and gives its engines 127.0.0.1 unless MOONCAKE_LOCAL_HOSTNAME is set.
func needTransfer(t *testing.T, kind string) {
	t.Helper()
	if kind != p2p.TransferMooncake {
		return
	}
	if os.Getenv(mooncake.EnvLibrary) == "" {
		t.Skipf("no real Mooncake Transfer Engine: set %s to a libtransfer_engine.so to run this", mooncake.EnvLibrary)
	}
	if os.Getenv(mooncake.EnvLocalHostname) == "" {
		t.Setenv(mooncake.EnvLocalHostname, "127.0.0.1")
	}
	if os.Getenv("MC_LOG_LEVEL") == "" {
		t.Setenv("MC_LOG_LEVEL", "ERROR")
	}
}

// TestCrossProcess runs the producer (TP 2) in this process and the
// consumer in a child process, opened by name, sharing nothing but the
// transfer parameters' bytes, which go to the child over a pipe with the
// prompt. The child loads the blocks through its own workers and checks
// every byte; this process checks the digests the child reports against
// its blocks, and sees them released well before keep_timeout (10
// minutes): only the consumer's done notice, written across the process
// boundary, can release them.
func TestCrossProcess(t *testing.T) {
	for _, kind := range xprocKinds() {
		t.Run(kind, func(t *testing.T) {
			needTransfer(t, kind)
			c := startXchild(t, roleConsume, kind)
			prod := openInstanceExtra(t, xprocIdentity(), connector.RoleProducer, "xproc-prefill-"+kind, xprocExtra(kind, "10m"))
			c.recv(t, "ready line")
			pblocks := []connector.BlockID{3, 4, 5, 6, 7, 8}
			params := prefill(t, prod, xprocTokens(), pblocks)
			start := time.Now()
			c.send(t, xprocMsg{Params: params, Tokens: xprocTokens()})
			res := c.recv(t, "load report")
			for rank := range prod.kv {
				if got := len(res.Sums[rank]); got != 5 {
					t.Fatalf("rank %d: the child reported %d blocks, want 5", rank, got)
				}
				for i, b := range pblocks[:5] {
					sum := sha256.Sum256(prod.block(rank, b))
					if got, want := res.Sums[rank][i], hex.EncodeToString(sum[:]); got != want {
						t.Errorf("rank %d: the child's block %d has SHA-256 %s, this process's block %d %s", rank, i, got, b, want)
					}
				}
			}
			prod.until(t, "the producer to release the blocks its consumer in the child process is done with", func(p *connector.Progress) bool {
				return slices.Contains(p.Released, "r")
			})
			if d := time.Since(start); d >= 10*time.Minute {
				t.Errorf("released after %v: keep_timeout (10m) could have released them", d)
			}
		})
	}
}

// TestCrossProcessKilledConsumer kills the child consumer with SIGKILL
// once it has reached into the producer's memory (it read the offer
// word, as a load does first) and before it read the blocks: the producer
// frees them once keep_timeout (2 s) passed, not before, and afterwards no
// process holds a segment file of the child, nor, once the producer
// closed, of this process.
func TestCrossProcessKilledConsumer(t *testing.T) {
	for _, kind := range xprocKinds() {
		t.Run(kind, func(t *testing.T) {
			needTransfer(t, kind)
			c := startXchild(t, roleHold, kind)
			prod := openInstanceExtra(t, xprocIdentity(), connector.RoleProducer, "xproc-prefill-killed-"+kind, xprocExtra(kind, "2s"))
			c.recv(t, "ready line")
			// The producer's keep_timeout runs from when it armed the
			// offer, after this.
			finished := time.Now()
			params := prefill(t, prod, xprocTokens(), []connector.BlockID{3, 4, 5, 6, 7, 8})
			c.send(t, xprocMsg{Params: params})
			if m := c.recv(t, "hold report"); !m.Held {
				t.Fatalf("the child reports %+v, want held", m)
			}
			pid := c.cmd.Process.Pid
			if kind == p2p.TransferShm && len(segmentFiles(t, pid))+len(segmentFiles(t, os.Getpid())) == 0 {
				t.Fatalf("no process holds a segment file of the child or of this process before the kill: the checks below could not fail")
			}
			c.kill(t)
			prod.until(t, "the producer to release the blocks of the killed consumer after keep_timeout", func(p *connector.Progress) bool {
				if slices.Contains(p.Released, "r") {
					if d := time.Since(finished); d < 2*time.Second {
						t.Fatalf("released %v after Finish, before keep_timeout (2s): nothing told the producer", d)
					}
					return true
				}
				return false
			})
			if kind != p2p.TransferShm {
				return
			}
			if held := segmentFiles(t, pid); len(held) > 0 {
				t.Errorf("after the child died, its segment files are still held:\n%s", strings.Join(held, "\n"))
			}
			prod.close(t, "xproc-prefill-killed-"+kind)
			if held := segmentFiles(t, os.Getpid()); len(held) > 0 {
				t.Errorf("after the producer closed, this process's segment files are still held:\n%s", strings.Join(held, "\n"))
			}
		})
	}
}

// TestCrossProcessKilledProducer runs the producer in the child and kills
// it with SIGKILL once it returned the transfer parameters: the
// consumer's load fails (to recompute, from the first block) within
// open_timeout (5 s) rather than hang, and the consumer frees the blocks.
func TestCrossProcessKilledProducer(t *testing.T) {
	for _, kind := range xprocKinds() {
		t.Run(kind, func(t *testing.T) {
			needTransfer(t, kind)
			c := startXchild(t, roleProduce, kind)
			cons := openInstanceExtra(t, xprocIdentity(), connector.RoleConsumer, "xproc-decode-killed-"+kind, xprocExtra(kind, "10m"))
			m := c.recv(t, "transfer parameters")
			c.kill(t)
			hashes, err := hashing.HashBlocks(4, m.Tokens)
			if err != nil {
				t.Fatal(err)
			}
			req := &connector.Request{ID: "r", Prompt: len(m.Tokens), Hashes: hashes, TransferParams: m.Params}
			match, err := cons.sched.Match(req, 0)
			if err != nil || match.Tokens != 5*4 {
				t.Fatalf("consumer Match = %+v, %v; want 20 tokens", match, err)
			}
			cblocks := []connector.BlockID{10, 11, 12, 13, 14, 15}
			if err := cons.sched.Allocated(req, match.Tokens, cblocks); err != nil {
				t.Fatal(err)
			}
			var failed []connector.LoadFailure
			cons.until(t, "the consumer's load from the killed producer to fail", func(p *connector.Progress) bool {
				if slices.Contains(p.Loaded, "r") {
					t.Fatalf("the load from a killed producer is reported loaded")
				}
				failed = append(failed, p.Failed...)
				return len(failed) > 0
			})
			if want := []connector.LoadFailure{{Req: "r", Valid: 0}}; !slices.Equal(failed, want) {
				t.Errorf("failed loads = %+v, want %+v", failed, want)
			}
			if keep, err := cons.sched.Finish(req, cblocks); err != nil || keep {
				t.Errorf("consumer Finish = %v, %v; want false", keep, err)
			}
		})
	}
}

// segmentFiles returns the mappings and descriptors, in every process this user
// can read, of an rdma/shm memory file of process pid.
func segmentFiles(t *testing.T, pid int) []string {
	t.Helper()
	out, err := shmfiles.Of(pid)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
