package main

// Tensor-parallel ranks as processes of their own (-tp N -tp-procs). This
// process runs the scheduler and the connector's scheduler half, and
// starts its own binary once per rank (the environment variable tpRoleEnv
// says so). Each rank process holds its shard's KV memory and a storeconn
// worker of its rank, which reaches the embedded store that lives here,
// served on a unix socket by store/remote. The two sides share nothing
// but what crosses the sockets: the scheduler ships each step's
// Metadata, encoded (connector.Metadata.MarshalBinary), with the step's
// items, and gets each rank's Output back encoded, beside the tokens it
// sampled. Each layer's all-reduce goes through here too: every rank sends
// its partial attention projection, and gets the sum back.
//
// A rank process that ends mid-run (killed, say) takes its step with it:
// the other ranks abandon the step where they are (the saves it planned
// fail; a rank that had every layer's sum already ends it whole), the ledger
// (connector.Ledger) writes what the lost rank never reported, the
// scheduler writes off the workers' KV (Scheduler.WorkersLost) and every
// request recomputes, loading again what the store holds of its prefix.
// A new process takes the rank's place.
//
// # Protocol
//
// Each rank process connects to this process's unix socket (in a
// temporary folder of mode 0700) and exchanges frames: an op byte, a
// uint32 little-endian length, and the payload.
//
//	rank → here   hello  JSON {rank, pid}: first, once the rank is open
//	here → rank   step   the step: len(meta) meta items (see tpStep)
//	rank → here   part   the rank's partial projections of the next layer, float32s
//	here → rank   sum    their sum over the ranks, float32s
//	here → rank   abort  instead of a sum: the step is abandoned
//	rank → here   done   the step's end: ntoks tokens (int32s) len(out) out
//	here → rank   stats  a request for the worker's counters
//	rank → here   stats  JSON connector.Stats
//
// This process ends a rank's input by closing the connection; the rank
// then closes its worker and its store client and exits.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/scheduler"
	"github.com/kvconnect/kvconnect/store/remote"
)

// The environment of a rank process.
const (
	tpRoleEnv   = "MINIENGINE_TP_ROLE"   // "rank": this process is a rank of -tp-procs
	tpConfigEnv = "MINIENGINE_TP_CONFIG" // its tpConfig, JSON
)

// tpConfig is what a rank process starts with.
type tpConfig struct {
	Rank        int     `json:"rank"`
	DieAt       string  `json:"die_at,omitempty"` // tests: "N:point", exit at that point of the N-th step (see dieAt)
	Blocks      int     `json:"blocks"`           // the KV pool's blocks
	Socket      string  `json:"socket"`           // the scheduler's unix socket
	StoreSocket string  `json:"store_socket"`     // the store's
	Options     Options `json:"options"`
}

// The ops of the frames.
const (
	opHello byte = iota + 1
	opStep
	opPart
	opSum
	opAbort
	opDone
	opStats
)

// tpRankTimeout bounds a rank's start (until its hello) and each step it
// computes: a rank that has not ended its step this long after the step
// was sent is taken for lost (and killed).
const tpRankTimeout = 2 * time.Minute

// tpHello is a rank's first frame.
type tpHello struct {
	Rank int `json:"rank"`
	PID  int `json:"pid"`
}

// frames reads and writes frames on a connection.
type frames struct {
	c   net.Conn
	r   *bufio.Reader
	hdr [5]byte
	buf []byte
}

func newFrames(c net.Conn) *frames { return &frames{c: c, r: bufio.NewReaderSize(c, 64<<10)} }

// write sends one frame of op whose payload is the concatenation of parts.
func (f *frames) write(op byte, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n > math.MaxUint32 {
		return fmt.Errorf("miniengine: a frame of %d bytes", n)
	}
	f.hdr[0] = op
	binary.LittleEndian.PutUint32(f.hdr[1:], uint32(n))
	bufs := net.Buffers{f.hdr[:]}
	for _, p := range parts {
		if len(p) > 0 {
			bufs = append(bufs, p)
		}
	}
	_, err := bufs.WriteTo(f.c)
	return err
}

// maxFrame is the largest frame payload read accepts.
const maxFrame = 1 << 30

// frameChunk is the first read of a payload: a buffer grows from it as
// its bytes arrive, at most doubling, so that a header that claims more
// than the peer sends costs no more memory than the bytes it did send.
const frameChunk = 64 << 10

// read returns the next frame; its payload is valid until the next read.
// The buffer it allocates is at most frameChunk, or twice the payload
// bytes already read, ahead of what arrived: a header claiming a large
// payload allocates its size only as the bytes come.
func (f *frames) read() (byte, []byte, error) {
	if _, err := io.ReadFull(f.r, f.hdr[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.LittleEndian.Uint32(f.hdr[1:]))
	if n > maxFrame {
		return 0, nil, fmt.Errorf("miniengine: a frame of %d bytes, more than %d", n, maxFrame)
	}
	f.buf = f.buf[:0]
	for len(f.buf) < n {
		want := min(n, max(frameChunk, 2*len(f.buf)))
		if cap(f.buf) < want {
			grown := make([]byte, len(f.buf), want)
			copy(grown, f.buf)
			f.buf = grown
		}
		got, err := io.ReadFull(f.r, f.buf[len(f.buf):want])
		f.buf = f.buf[:len(f.buf)+got]
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, nil, fmt.Errorf("miniengine: a frame of %d bytes ended after %d: %w", n, len(f.buf), err)
		}
	}
	return f.hdr[0], f.buf, nil
}

// expect reads the next frame and fails unless its op is op.
func (f *frames) expect(op byte) ([]byte, error) {
	got, p, err := f.read()
	if err != nil {
		return nil, err
	}
	if got != op {
		return nil, fmt.Errorf("miniengine: frame op %d, want %d", got, op)
	}
	return p, nil
}

// floatBytes views floats as their bytes (little-endian on every platform
// Go's unix sockets run this on; the ranks are processes of one host).
func floatBytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// bytesFloats copies b, float32s as floatBytes wrote them, into dst.
func bytesFloats(dst []float32, b []byte) error {
	if len(b) != 4*len(dst) {
		return fmt.Errorf("miniengine: %d bytes of floats, want %d floats", len(b), len(dst))
	}
	copy(floatBytes(dst), b)
	return nil
}

// tpStep encodes the step's Metadata (nil: none) and items:
//
//	step  = nmeta meta nitems item*
//	item  = start end ntoks token* nblocks block*
//
// every integer a uvarint; ntoks tokens are those of [start, end).
func tpStep(dst []byte, meta *connector.Metadata, its []stepItem) ([]byte, error) {
	var mb []byte
	if meta != nil {
		var err error
		if mb, err = meta.MarshalBinary(); err != nil {
			return nil, err
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(mb)))
	dst = append(dst, mb...)
	dst = binary.AppendUvarint(dst, uint64(len(its)))
	for _, it := range its {
		dst = binary.AppendUvarint(dst, uint64(it.Start))
		dst = binary.AppendUvarint(dst, uint64(it.End))
		dst = binary.AppendUvarint(dst, uint64(it.End-it.Start))
		for _, t := range it.Tokens[it.Start:it.End] {
			dst = binary.AppendUvarint(dst, uint64(t))
		}
		dst = binary.AppendUvarint(dst, uint64(len(it.Blocks)))
		for _, b := range it.Blocks {
			dst = binary.AppendUvarint(dst, uint64(b))
		}
	}
	return dst, nil
}

// parseStep decodes tpStep's encoding; meta is nil when the step has none.
// An item's positions must fit its blocks of blockSize tokens (End at most
// len(Blocks)×blockSize), so the tokens it allocates, End per item, are at
// most blockSize per byte of the frame: a small frame never allocates
// much.
func parseStep(b []byte, its []stepItem, blockSize int) (*connector.Metadata, []stepItem, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("miniengine: a malformed step frame: %s", fmt.Sprintf(format, args...))
	}
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	n, ok := next()
	if !ok || n > uint64(len(b)) {
		return nil, nil, bad("metadata of %d bytes, %d left", n, len(b))
	}
	var meta *connector.Metadata
	if n > 0 {
		meta = new(connector.Metadata)
		if err := meta.UnmarshalBinary(b[:n]); err != nil {
			return nil, nil, err
		}
	}
	b = b[n:]
	count, ok := next()
	if !ok || count > uint64(len(b)) {
		return nil, nil, bad("%d items, %d bytes left", count, len(b))
	}
	for i := range count {
		start, ok1 := next()
		end, ok2 := next()
		nt, ok3 := next()
		if !ok1 || !ok2 || !ok3 || start > end || end-start != nt || nt > uint64(len(b)) {
			return nil, nil, bad("item %d: start %d, end %d, %d tokens", i, start, end, nt)
		}
		// The tokens come before the blocks: skip them to learn how
		// many blocks there are, which bound end, before allocating.
		toks := b
		for range nt {
			if _, ok := next(); !ok {
				return nil, nil, bad("item %d: %d tokens, the frame ends first", i, nt)
			}
		}
		nb, ok := next()
		if !ok || nb > uint64(len(b)) {
			return nil, nil, bad("item %d: %d blocks, %d bytes left", i, nb, len(b))
		}
		if end > nb*uint64(blockSize) {
			return nil, nil, bad("item %d: end = %d, but %d blocks of %d tokens hold %d", i, end, nb, blockSize, nb*uint64(blockSize))
		}
		it := stepItem{Start: int(start), End: int(end), Tokens: make([]hashing.Token, end), Blocks: make([]connector.BlockID, 0, nb)}
		for j := range nt {
			v, k := binary.Uvarint(toks)
			toks = toks[k:]
			it.Tokens[start+j] = hashing.Token(v)
		}
		for range nb {
			v, ok := next()
			if !ok || v > math.MaxInt32 {
				return nil, nil, bad("item %d: block %d", i, v)
			}
			it.Blocks = append(it.Blocks, connector.BlockID(v))
		}
		its = append(its, it)
	}
	if len(b) != 0 {
		return nil, nil, bad("%d bytes after the items", len(b))
	}
	return meta, its, nil
}

// tpProc is the scheduler's record of a rank process.
type tpProc struct {
	*child
	rank int
	conn net.Conn
	f    *frames
}

// describe names the process, how it ended and what it wrote on stderr.
func (p *tpProc) describe() string {
	s := fmt.Sprintf("rank %d (pid %d)", p.rank, p.pid())
	select {
	case <-p.exited:
		s += fmt.Sprintf(", ended: %v", p.err)
	default:
	}
	return s + p.said()
}

// stop ends the process: its input first, then a kill after wait.
func (p *tpProc) stop(wait time.Duration) {
	if p.conn != nil {
		p.conn.Close()
	}
	p.endWithin(wait)
}

// procRanks are ranks in processes of their own.
type procRanks struct {
	o      Options
	exe    string
	ln     *net.UnixListener
	store  string // the store's socket
	blocks int    // KV blocks of every rank
	procs  []*tpProc
	ledger *connector.Ledger
	its    []stepItem
	msg    []byte
	parts  [][]float32 // per rank, the partial projections of the layer
	sum    []float32
	toks   [][]hashing.Token
	outs   []*connector.Output
	lost   []string // the lost processes, described
	pids   []int    // every process started, in order
	// lostTransfers counts the transfers lost ranks never reported
	lostTransfers int
	// started counts, per rank, the processes started
	started []int
	onStep  func(m *connector.Metadata, procs []*os.Process)
}

// newProcRanks starts the o.TP rank processes and waits for their hello.
func newProcRanks(ctx context.Context, o Options, blocks int, dir, storeSocket string) (*procRanks, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "ranks.sock"), Net: "unix"})
	if err != nil {
		return nil, err
	}
	pr := &procRanks{o: o, exe: exe, ln: ln, store: storeSocket, ledger: connector.NewLedger(o.TP),
		procs: make([]*tpProc, o.TP), parts: make([][]float32, o.TP), toks: make([][]hashing.Token, o.TP),
		blocks: blocks, onStep: o.tpOnStep, started: make([]int, o.TP)}
	for r := range o.TP {
		if err := pr.start(ctx, r); err != nil {
			return nil, errors.Join(err, pr.close())
		}
	}
	return pr, nil
}

// start starts the process of rank r and waits for its hello; it takes
// rank r's place only then. A process that fails to start is stopped.
func (pr *procRanks) start(ctx context.Context, r int) error {
	cfg := tpConfig{Rank: r, Blocks: pr.blocks, Socket: pr.ln.Addr().String(), StoreSocket: pr.store, Options: pr.o}
	if d := pr.o.tpDie; d.at != "" && d.rank == r && pr.started[r] == 0 {
		cfg.DieAt = d.at
	}
	pr.started[r]++
	js, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	c, err := startChild(pr.exe, tpRoleEnv+"=rank", tpConfigEnv+"="+string(js))
	if err != nil {
		return fmt.Errorf("start rank %d: %w", r, err)
	}
	p := &tpProc{child: c, rank: r}
	pr.pids = append(pr.pids, p.pid())
	if err := pr.connect(ctx, p); err != nil {
		p.stop(0)
		return err
	}
	pr.procs[r] = p
	return nil
}

// connect accepts the connection of p, until it connects, ends, ctx is
// done or tpRankTimeout passes, and reads its hello.
func (pr *procRanks) connect(ctx context.Context, p *tpProc) error {
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	pr.ln.SetDeadline(time.Now().Add(tpRankTimeout))
	go func() {
		c, err := pr.ln.Accept()
		ch <- accepted{c, err}
	}()
	stopAccept := func() {
		pr.ln.SetDeadline(time.Now())
		if a := <-ch; a.c != nil {
			a.c.Close()
		}
	}
	select {
	case a := <-ch:
		if a.err != nil {
			return fmt.Errorf("rank %d did not connect: %w; %s", p.rank, a.err, p.describe())
		}
		p.conn, p.f = a.c, newFrames(a.c)
	case <-p.exited:
		stopAccept()
		return fmt.Errorf("%s before it connected", p.describe())
	case <-ctx.Done():
		stopAccept()
		return ctx.Err()
	}
	p.conn.SetDeadline(time.Now().Add(tpRankTimeout))
	b, err := p.f.expect(opHello)
	if err != nil {
		return fmt.Errorf("rank %d hello: %w; %s", p.rank, err, p.describe())
	}
	var h tpHello
	if err := json.Unmarshal(b, &h); err != nil || h.Rank != p.rank || h.PID != p.pid() {
		return fmt.Errorf("rank %d (pid %d) said hello %q: %v", p.rank, p.pid(), b, err)
	}
	return nil
}

func (pr *procRanks) step(ctx context.Context, plan *scheduler.Plan, toks []hashing.Token, outs []*connector.Output) ([]hashing.Token, []*connector.Output, error) {
	if pr.onStep != nil {
		ps := make([]*os.Process, len(pr.procs))
		for i, p := range pr.procs {
			ps[i] = p.cmd.Process
		}
		pr.onStep(plan.Metadata, ps)
	}
	pr.its = items(plan, pr.its[:0])
	var err error
	if pr.msg, err = tpStep(pr.msg[:0], plan.Metadata, pr.its); err != nil {
		return toks, outs, err
	}
	if err := pr.ledger.Shipped(plan.Metadata); err != nil {
		return toks, outs, err
	}
	// ctx's end ends every wait on a rank at once.
	conns := make([]net.Conn, len(pr.procs))
	for r, p := range pr.procs {
		conns[r] = p.conn
	}
	stopWatch := context.AfterFunc(ctx, func() {
		for _, c := range conns {
			c.SetDeadline(time.Now())
		}
	})
	defer stopWatch()
	// down[r] is the error that lost rank r; waiting[r] says the rank
	// waits for a sum (or an abort).
	down := make([]error, len(pr.procs))
	waiting := make([]bool, len(pr.procs))
	lost := func() bool {
		for _, e := range down {
			if e != nil {
				return true
			}
		}
		return false
	}
	for r, p := range pr.procs {
		p.conn.SetDeadline(time.Now().Add(tpRankTimeout))
		if err := p.f.write(opStep, pr.msg); err != nil {
			down[r] = err
		}
	}
	d := pr.o.Model.Dim
	n := 0
	for _, it := range pr.its {
		n += (it.End - it.Start) * d
	}
	for l := 0; l < pr.o.Model.Layers && !lost(); l++ {
		for r, p := range pr.procs {
			if down[r] != nil {
				continue
			}
			b, err := p.f.expect(opPart)
			if err == nil {
				pr.parts[r] = slices.Grow(pr.parts[r][:0], n)[:n]
				err = bytesFloats(pr.parts[r], b)
			}
			if err != nil {
				down[r] = err
				continue
			}
			waiting[r] = true
		}
		if lost() {
			break
		}
		pr.sum = zeros(pr.sum, n)
		for r := range pr.procs {
			addTo(pr.sum, pr.parts[r])
		}
		for r, p := range pr.procs {
			waiting[r] = false
			if err := p.f.write(opSum, floatBytes(pr.sum)); err != nil {
				down[r] = err
			}
		}
	}
	// Every rank that is not lost ends the step: those that wait for a
	// sum are told to abandon it; those that sent a part the step no
	// longer wants have their part read first.
	abandon := lost()
	pr.outs = pr.outs[:0]
	for r, p := range pr.procs {
		if down[r] != nil {
			continue
		}
		if abandon && !waiting[r] {
			// The rank may be computing the layer whose part did not
			// get read: read it, unless it already sent its done.
			op, b, err := p.f.read()
			switch {
			case err != nil:
				down[r] = err
				continue
			case op == opPart:
				waiting[r] = true
			case op == opDone:
				if err := pr.done(r, b); err != nil {
					down[r] = err
				}
				continue
			default:
				down[r] = fmt.Errorf("miniengine: frame op %d, want a part or a done", op)
				continue
			}
		}
		if abandon {
			if err := p.f.write(opAbort); err != nil {
				down[r] = err
				continue
			}
		}
		b, err := p.f.expect(opDone)
		if err == nil {
			err = pr.done(r, b)
		}
		if err != nil {
			down[r] = err
		}
	}
	if !lost() {
		toks = append(toks, pr.toks[0]...)
		for r := 1; r < len(pr.procs); r++ {
			if err := sameTokens(pr.toks[0], pr.toks[r], r); err != nil {
				return toks, outs, err
			}
		}
		return toks, append(outs, pr.outs...), nil
	}
	// A rank is lost: what it never reported ends, failed, and a new
	// process takes its place.
	outs = append(outs, pr.outs...)
	var why []string
	var gone []int
	for r, e := range down {
		if e == nil {
			continue
		}
		p := pr.procs[r]
		p.stop(10 * time.Second)
		lo, err := pr.ledger.Lost(r, connector.ReasonCanceled)
		if err != nil {
			return toks, outs, err
		}
		pr.lostTransfers += len(lo.Done)
		outs = append(outs, lo)
		desc := fmt.Sprintf("%s: %v", p.describe(), e)
		pr.lost = append(pr.lost, desc)
		why = append(why, desc)
		gone = append(gone, r)
	}
	lostErr := fmt.Errorf("%w in step %d: %s", errRankLost, plan.Step, strings.Join(why, "; "))
	if err := ctx.Err(); err != nil {
		return toks, outs, errors.Join(err, lostErr)
	}
	for _, r := range gone {
		if err := pr.start(ctx, r); err != nil {
			return toks, outs, fmt.Errorf("%w: rank %d: %w (after %w)", errRankRestart, r, err, lostErr)
		}
	}
	return toks, outs, lostErr
}

// done records rank r's done frame: its tokens, and its Output.
func (pr *procRanks) done(r int, b []byte) error {
	bad := fmt.Errorf("miniengine: rank %d: a malformed done frame", r)
	nt, k := binary.Uvarint(b)
	if k <= 0 || nt > uint64(len(b)) {
		return bad
	}
	b = b[k:]
	pr.toks[r] = pr.toks[r][:0]
	for range nt {
		v, k := binary.Uvarint(b)
		if k <= 0 {
			return bad
		}
		b = b[k:]
		pr.toks[r] = append(pr.toks[r], hashing.Token(v))
	}
	no, k := binary.Uvarint(b)
	if k <= 0 || no != uint64(len(b)-k) {
		return bad
	}
	b = b[k:]
	if no == 0 {
		return nil // no connector
	}
	o := new(connector.Output)
	if err := o.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("miniengine: rank %d's Output: %w", r, err)
	}
	if o.Rank != r {
		return fmt.Errorf("miniengine: the process of rank %d reports Output.Rank = %d", r, o.Rank)
	}
	if err := pr.ledger.Reported(o); err != nil {
		return err
	}
	pr.outs = append(pr.outs, o)
	return nil
}

func (pr *procRanks) wakes(dst []<-chan struct{}) ([]<-chan struct{}, bool) { return dst, false }

// stats asks every rank for its worker's counters (a lost process's are
// lost with it).
func (pr *procRanks) stats() connector.Stats {
	var st connector.Stats
	for _, p := range pr.procs {
		p.conn.SetDeadline(time.Now().Add(tpRankTimeout))
		var s connector.Stats
		err := p.f.write(opStats)
		if err == nil {
			var b []byte
			if b, err = p.f.expect(opStats); err == nil {
				err = json.Unmarshal(b, &s)
			}
		}
		if err != nil {
			// The stream may hold half a reply: nothing more is read
			// from it, and the next step finds the rank lost.
			p.conn.Close()
			continue
		}
		st = addStats(st, s)
	}
	return st
}

// close ends every rank process: each closes its worker and exits once
// its input ends.
func (pr *procRanks) close() error {
	var errs []error
	for _, p := range pr.procs {
		if p == nil {
			continue
		}
		p.stop(time.Minute)
		if p.err != nil {
			errs = append(errs, fmt.Errorf("%s", p.describe()))
		}
	}
	pr.procs = nil
	return errors.Join(append(errs, pr.ln.Close())...)
}

// tpRank runs this process as a rank of -tp-procs, as tpRoleEnv says, and
// returns its exit code.
func tpRank(ctx context.Context, errw io.Writer) int {
	var cfg tpConfig
	if err := json.Unmarshal([]byte(os.Getenv(tpConfigEnv)), &cfg); err != nil {
		fmt.Fprintf(errw, "miniengine rank (pid %d): %s: %v\n", os.Getpid(), tpConfigEnv, err)
		return 1
	}
	if err := serveRank(ctx, cfg); err != nil {
		fmt.Fprintf(errw, "miniengine rank %d (pid %d): %v\n", cfg.Rank, os.Getpid(), err)
		return 1
	}
	return 0
}

// serveRank opens the rank (its store client, worker and KV memory),
// connects to the scheduler and computes its steps until its input ends.
func serveRank(ctx context.Context, cfg tpConfig) (err error) {
	o := cfg.Options
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	st, err := remote.Dial(dctx, "unix", cfg.StoreSocket, remote.ClientOptions{})
	cancel()
	if err != nil {
		return fmt.Errorf("the store: %w", err)
	}
	defer func() { err = errors.Join(err, st.Close()) }()
	env := connector.Env{Identity: o.identity(0), Store: st, Rank: cfg.Rank, Blocks: cfg.Blocks}
	w, err := connector.OpenWorker(o.connectorConfig(), env)
	if err != nil {
		return err
	}
	r, err := newRank(o.model(0), Shard{Rank: cfg.Rank, TP: o.TP}, o.Par, o.Block, cfg.Blocks, w)
	if err != nil {
		return errors.Join(err, w.Close())
	}
	defer func() { err = errors.Join(err, r.close()) }()
	var d net.Dialer
	dctx, cancel = context.WithTimeout(ctx, time.Minute)
	c, err := d.DialContext(dctx, "unix", cfg.Socket)
	cancel()
	if err != nil {
		return fmt.Errorf("connect to the scheduler: %w", err)
	}
	defer c.Close()
	f := newFrames(c)
	hello, _ := json.Marshal(tpHello{Rank: cfg.Rank, PID: os.Getpid()})
	if err := f.write(opHello, hello); err != nil {
		return err
	}
	var its []stepItem
	var part []float32
	var toks []hashing.Token
	var msg []byte
	die, err := parseDieAt(cfg.DieAt)
	if err != nil {
		return err
	}
	steps := 0
	for {
		op, b, err := f.read()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil // the input ended
			}
			return err
		}
		switch op {
		case opStats:
			var s connector.Stats
			if sr, ok := w.(connector.StatsReporter); ok {
				s = sr.Stats()
			}
			js, _ := json.Marshal(s)
			if err := f.write(opStats, js); err != nil {
				return err
			}
			continue
		case opStep:
		default:
			return fmt.Errorf("frame op %d, want a step or a stats request", op)
		}
		steps++
		var meta *connector.Metadata
		if meta, its, err = parseStep(b, its[:0], o.Block); err != nil {
			return err
		}
		die.arm(steps, meta)
		die.at("step")
		if err := r.begin(ctx, meta, its); err != nil {
			return err
		}
		abandoned := false
		for l := 0; l < o.Model.Layers && !abandoned; l++ {
			part = part[:0]
			for _, p := range r.passes {
				part = append(part, p.Attend(l)...)
			}
			if err := f.write(opPart, floatBytes(part)); err != nil {
				return err
			}
			die.at(fmt.Sprintf("part%d", l))
			op, b, err := f.read()
			if err != nil {
				return err
			}
			die.at(fmt.Sprintf("sum%d", l))
			switch op {
			case opAbort:
				abandoned = true
				continue
			case opSum:
			default:
				return fmt.Errorf("frame op %d, want a sum or an abort", op)
			}
			if err := bytesFloats(part, b); err != nil {
				return err
			}
			off := 0
			for i, p := range r.passes {
				n := (its[i].End - its[i].Start) * o.Model.Dim
				p.Finish(l, part[off:off+n])
				off += n
			}
		}
		var out *connector.Output
		toks = toks[:0]
		if abandoned {
			out, err = r.abandon(ctx)
		} else {
			toks, out, err = r.end(ctx, toks)
		}
		if err != nil {
			return err
		}
		msg = binary.AppendUvarint(msg[:0], uint64(len(toks)))
		for _, t := range toks {
			msg = binary.AppendUvarint(msg, uint64(t))
		}
		var ob []byte
		if out != nil {
			if ob, err = out.MarshalBinary(); err != nil {
				return err
			}
		}
		msg = binary.AppendUvarint(msg, uint64(len(ob)))
		msg = append(msg, ob...)
		die.at("end")
		if err := f.write(opDone, msg); err != nil {
			return err
		}
		die.at("done")
	}
}

// dieAt is a test's order to a rank process to exit, as a crash would, at
// one point of one step: "N:point", in the first step from the N-th step
// frame on whose Metadata hands the rank a transfer (so that the loss
// leaves transfers it never reports), at point: step (the frame came),
// partL (it sent layer L's part), sumL (the sum or abort of layer L
// came), end (the step's saves started, its done not sent) or done (its
// done sent).
type dieAt struct {
	step  int
	point string
	armed bool // this step is the one
}

func parseDieAt(s string) (*dieAt, error) {
	d := &dieAt{}
	if s == "" {
		return d, nil
	}
	n, point, ok := strings.Cut(s, ":")
	if _, err := fmt.Sscan(n, &d.step); err != nil || !ok || point == "" || d.step < 1 {
		return nil, fmt.Errorf("die_at = %q, want N:point", s)
	}
	d.point = point
	return d, nil
}

// arm makes the step-th step, of Metadata meta, the one to exit in when
// it is the order's.
func (d *dieAt) arm(step int, meta *connector.Metadata) {
	d.armed = d.point != "" && step >= d.step && meta != nil && len(meta.Loads)+len(meta.Saves) > 0
}

// at exits the process at point of the armed step.
func (d *dieAt) at(point string) {
	if d.armed && d.point == point {
		os.Exit(3)
	}
}

// tpReport is what runTPProcs learnt besides the run's Stats.
type tpReport struct {
	pids  []int    // every rank process started, in order
	lost  []string // the processes lost mid-run, described
	steps int      // steps whose work a lost rank took with it
	held  int      // requests whose blocks the connector still held when the run ended
	xfers int      // transfers the lost ranks never reported (connector.Ledger.Lost)
	used  int      // blocks still in use when the run ended
}

// runTPProcs runs the workload with the connector on, on one engine whose
// o.TP ranks are processes of their own started from this binary, over
// the embedded store served on a unix socket.
func runTPProcs(ctx context.Context, o Options, blocks int) (_ Run, err error) {
	o = o.forRun()
	dir, err := os.MkdirTemp("", "miniengine-tp-") // mode 0700
	if err != nil {
		return Run{}, err
	}
	defer os.RemoveAll(dir)
	st, closeStore, err := o.newStore()
	if err != nil {
		return Run{}, err
	}
	defer closeStore()
	storeSocket := filepath.Join(dir, "store.sock")
	ln, err := remote.Listen("unix", storeSocket)
	if err != nil {
		return Run{}, err
	}
	srv, err := remote.NewServer(st, remote.ServerOptions{})
	if err != nil {
		ln.Close()
		return Run{}, err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Close()
		if serr := <-served; !errors.Is(serr, remote.ErrServerClosed) {
			err = errors.Join(err, fmt.Errorf("the store's server: %w", serr))
		}
	}()
	pr, err := newProcRanks(ctx, o, blocks, dir, storeSocket)
	if err != nil {
		return Run{}, err
	}
	rep := &tpReport{}
	cfg := o.engineConfig(0, blocks)
	cfg.Store, cfg.Connector, cfg.ranks = st, o.connectorConfig(), pr
	e, err := NewEngine(cfg)
	if err != nil {
		return Run{}, errors.Join(err, pr.close())
	}
	stats, runErr := run(ctx, []*Engine{e}, o.Workload, func(int, int) int { return 0 }, hooks{wait: o.Wait}, nil)
	rep.lost, rep.steps, rep.pids, rep.xfers = pr.lost, e.lost, pr.pids, pr.lostTransfers
	ss := e.sched.Stats()
	rep.held, rep.used = ss.Held, ss.Pool.Used
	closeErr := e.Close()
	r := newRun("connector on, ranks as processes", true, blocks, stats)
	r.tp = rep
	r.RanksLost = len(rep.lost)
	return r, errors.Join(runErr, closeErr)
}
