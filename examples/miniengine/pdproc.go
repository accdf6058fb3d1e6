package main

// Prefill and decode as processes of their own (-pd, -pd-transfer shm or
// mooncake). This process is the coordinator, in the part vLLM's
// disaggregation proxy plays: it drives the workload, and starts its own
// binary twice, as the prefill instance and as the decode instance (the
// environment variable pdRoleEnv says which). Each instance opens the p2p
// connector by name with its own transfer engine; the two share nothing
// but the transfer parameters the coordinator carries from one to the
// other. The coordinator outlives either instance, so it can report the
// requests a dead decode instance took with it as failed, and hand the
// requests of a dead prefill instance to the decode instance to compute
// itself.
//
// # Protocol
//
// Each instance connects to the coordinator's unix socket (in a temporary
// folder of mode 0700) and exchanges pdMsg values, one JSON object a line:
//
//	instance → coordinator  hello   {role, pid, engine}: first, once the engine is open
//	coordinator → instance  submit  {id, prompt, max_tokens, params}: a request (params: for decode, the producer's)
//	coordinator → decode    forget  {engine}: the prefill instance of that engine_id is gone (p2p Scheduler.Forget)
//	instance → coordinator  done    {id, out, err, first, done, params, local, external, computed}: a request ended
//	instance → coordinator  bye     {stats}: last, once its input ended and its engine closed
//
// The coordinator ends an instance's input by closing its half of the
// connection; the instance then finishes what it holds (a prefill
// instance keeps stepping until the consumer is done with every kept
// request, or keep_timeout expired it), closes its engine, says bye and
// exits. An instance whose coordinator is gone does the same.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/p2p"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma/mooncake"
	"github.com/kvconnect/kvconnect/rdma/shm"
)

// The environment of an instance process.
const (
	pdRoleEnv   = "MINIENGINE_PD_ROLE"   // "prefill" or "decode": this process is an instance of -pd
	pdSocketEnv = "MINIENGINE_PD_SOCKET" // the coordinator's unix socket
	pdConfigEnv = "MINIENGINE_PD_CONFIG" // the instance's pdConfig, JSON
)

// The roles of the instance processes.
const (
	rolePrefill = "prefill"
	roleDecode  = "decode"
)

// errInstanceGone: an instance process ended before the run did. The
// decode instance's requests are then lost (counted failed); the prefill
// instance's are computed by the decode instance.
var errInstanceGone = errors.New("miniengine: instance process gone")

// pdConfig is what an instance process starts with.
type pdConfig struct {
	Role        string        `json:"role"`
	EngineID    string        `json:"engine_id"`
	Transfer    string        `json:"transfer"` // the p2p connector's "transfer": shm or mooncake
	KeepTimeout time.Duration `json:"keep_timeout"`
	Options     Options       `json:"options"`
}

// pdMsg is a message between the coordinator and an instance (see the
// protocol above); Op says which fields it uses.
type pdMsg struct {
	Op        string              `json:"op"`
	Role      string              `json:"role,omitempty"`
	PID       int                 `json:"pid,omitempty"`
	Engine    string              `json:"engine,omitempty"`
	ID        connector.RequestID `json:"id,omitempty"`
	Prompt    []hashing.Token     `json:"prompt,omitempty"`
	MaxTokens int                 `json:"max_tokens,omitempty"`
	Params    []byte              `json:"params,omitempty"`
	Out       []hashing.Token     `json:"out,omitempty"`
	Err       string              `json:"err,omitempty"`
	First     int64               `json:"first,omitempty"` // wall clock, Unix ns; 0: no token came
	Done      int64               `json:"done,omitempty"`
	Local     int                 `json:"local,omitempty"`
	External  int                 `json:"external,omitempty"`
	Computed  int                 `json:"computed,omitempty"`
	Stats     *pdStats            `json:"stats,omitempty"`
}

// pdStats is an instance's account of its run, in its bye.
type pdStats struct {
	Sched, Worker connector.Stats
	IdleSteps     int
	Forgotten     int    // producers written off (forget)
	Unloaded      int    // requests that came with transfer parameters and loaded nothing: computed here
	HeldAtEnd     int    // requests whose blocks the connector kept when the input ended
	HeldAtClose   int    // ... when the engine closed: 0 unless the drain gave up
	Unsent        int    // ended requests that could not be reported: the coordinator was gone
	CloseErr      string // the engine's Close, "" when it returned nil
}

// pdReport is what runPDProcs learnt besides the run's Stats.
type pdReport struct {
	transfer      string
	lost          string // the role of the instance that ended mid-run, "" for none
	rerouted      int    // requests sent to the prefill instance that the decode instance computed instead
	prefill       pdStats
	decode        pdStats
	prefillPID    int
	decodePID     int
	prefillEngine string
}

// pdInstance runs this process as an instance of -pd, as pdRoleEnv says,
// and returns its exit code.
func pdInstance(ctx context.Context, errw io.Writer) int {
	role := os.Getenv(pdRoleEnv)
	if err := servePD(ctx, role, errw); err != nil {
		fmt.Fprintf(errw, "miniengine %s instance (pid %d): %v\n", role, os.Getpid(), err)
		return 1
	}
	return 0
}

// servePD connects to the coordinator and serves requests until its input
// ends, then finishes what it holds.
func servePD(ctx context.Context, role string, errw io.Writer) error {
	var cfg pdConfig
	if err := json.Unmarshal([]byte(os.Getenv(pdConfigEnv)), &cfg); err != nil {
		return fmt.Errorf("%s: %w", pdConfigEnv, err)
	}
	if cfg.Role != role {
		return fmt.Errorf("%s = %q, but %s says role %q", pdRoleEnv, role, pdConfigEnv, cfg.Role)
	}
	// The engine first: an instance that cannot open it exits before it
	// connects, and the coordinator reports its stderr.
	e, err := cfg.open()
	if err != nil {
		return err
	}
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	conn, err := d.DialContext(dctx, "unix", os.Getenv(pdSocketEnv))
	cancel()
	if err != nil {
		return errors.Join(fmt.Errorf("connect to the coordinator: %w", err), e.Close())
	}
	s := &pdServer{cfg: cfg, e: e, enc: json.NewEncoder(conn)}
	in := make(chan pdMsg)
	var readErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(in)
		dec := json.NewDecoder(conn)
		for {
			var m pdMsg
			if readErr = dec.Decode(&m); readErr != nil {
				return
			}
			in <- m
		}
	}()
	runErr := s.serve(ctx, in)
	st := s.stats()
	closeErr := e.Close()
	if closeErr != nil {
		st.CloseErr = closeErr.Error()
	}
	if s.send(pdMsg{Op: "bye", Stats: &st}); s.sendErr != nil {
		// Nobody reads the bye: say on stderr how the instance ended.
		fmt.Fprintf(errw, "miniengine %s instance (pid %d): the coordinator is gone (%v): %d requests ended unreported, %d kept requests released; engine closed\n",
			role, os.Getpid(), s.sendErr, st.Unsent, st.HeldAtEnd)
	}
	// Unblock and join the reader.
	connErr := conn.Close()
	for range in {
	}
	wg.Wait()
	if errors.Is(readErr, io.EOF) || errors.Is(readErr, net.ErrClosed) {
		readErr = nil
	}
	return errors.Join(runErr, closeErr, connErr, readErr)
}

// open opens the instance's engine: the p2p connector by name, with the
// transfer engine its worker opens, and the KV memory from that engine
// when it registers only its own (shm).
func (c pdConfig) open() (*Engine, error) {
	o := c.Options
	role := connector.RoleProducer
	if c.Role == roleDecode {
		role = connector.RoleConsumer
	}
	cc := connector.Config{Connector: p2p.Name, Role: role, EngineID: c.EngineID,
		Extra: map[string]any{"transfer": c.Transfer, "keep_timeout": c.KeepTimeout.String()}}
	env := connector.Env{Identity: o.identity(0)}
	s, err := connector.OpenPlanner(cc, env)
	if err != nil {
		return nil, err
	}
	w, err := connector.OpenWorker(cc, env)
	if err != nil {
		return nil, errors.Join(err, s.Close())
	}
	ec := o.engineConfig(0, o.Blocks)
	ec.Conn, ec.Worker = s, w
	if pw, ok := w.(*p2p.Worker); ok {
		if se, ok := pw.Engine().(*shm.Engine); ok {
			ec.Alloc = func(n int) (Memory, error) {
				m, err := se.Alloc(n)
				if err != nil {
					return nil, err
				}
				return m, nil
			}
		}
	}
	e, err := NewEngine(ec)
	if err != nil {
		// NewEngine closed the halves if it took them; Close is idempotent.
		return nil, errors.Join(err, w.Close(), s.Close())
	}
	return e, nil
}

// pdServer is an instance's side of the protocol. It is used from one
// goroutine, but for the reader that serve starts and joins.
type pdServer struct {
	cfg     pdConfig
	e       *Engine
	enc     *json.Encoder
	sendErr error
	st      pdStats
	params  map[connector.RequestID]bool // requests that came with transfer parameters
}

// send writes m to the coordinator; after the first failure (the
// coordinator is gone) it writes nothing more and reports false.
func (s *pdServer) send(m pdMsg) bool {
	if s.sendErr == nil {
		s.sendErr = s.enc.Encode(m)
	}
	return s.sendErr == nil
}

func (s *pdServer) stats() pdStats {
	st := s.st
	st.Sched, st.Worker = s.e.ConnStats()
	st.IdleSteps = s.e.IdleSteps()
	st.HeldAtClose = s.e.sched.Stats().Held
	return st
}

// serve runs the engine on the coordinator's requests until the input
// ended and the engine holds nothing more.
func (s *pdServer) serve(ctx context.Context, in <-chan pdMsg) error {
	s.params = map[connector.RequestID]bool{}
	if !s.send(pdMsg{Op: "hello", Role: s.cfg.Role, PID: os.Getpid(), Engine: s.cfg.EngineID}) {
		return fmt.Errorf("hello: %w", s.sendErr)
	}
	w := s.cfg.Options.Workload
	done := make(chan finished, w.Sessions*w.Turns+1)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	open := true
	var ended time.Time // when the input ended
	bound := s.cfg.KeepTimeout + time.Minute
	woken := false
	for {
		if s.e.Busy() && (woken || !s.e.Idle()) {
			if err := s.e.Step(ctx); err != nil {
				return err
			}
			woken = false
		} else {
			if !open && !s.e.Busy() {
				return nil
			}
			// Nothing to compute: wait for a request, the connector's
			// news or a tick (keep_timeout expires in a worker's Poll).
			cases := []reflect.SelectCase{
				{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
				{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(tick.C)},
			}
			if open {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(in)})
			}
			for _, c := range s.e.Wakes(nil) {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
			}
			i, v, ok := reflect.Select(cases)
			switch {
			case i == 0:
				return ctx.Err()
			case i == 2 && open && !ok:
				open, ended = false, time.Now()
				s.st.HeldAtEnd = s.e.sched.Stats().Held
			case i == 2 && open:
				if err := s.handle(v.Interface().(pdMsg), done); err != nil {
					return err
				}
			}
			woken = true
		}
		for open {
			m, ok, more := tryRecv(in)
			if !more {
				break
			}
			if !ok {
				open, ended = false, time.Now()
				s.st.HeldAtEnd = s.e.sched.Stats().Held
				break
			}
			if err := s.handle(m, done); err != nil {
				return err
			}
		}
		for len(done) > 0 {
			f := <-done
			m := pdMsg{Op: "done", ID: f.ID, Out: f.Out, Done: f.Done.UnixNano(),
				Local: f.Metrics.LocalTokens, External: f.Metrics.ExternalTokens, Computed: f.Metrics.ComputedTokens}
			if !f.First.IsZero() {
				m.First = f.First.UnixNano()
			}
			if f.Err != nil {
				m.Err = f.Err.Error()
			} else if s.cfg.Role == rolePrefill {
				m.Params = s.e.TransferParams(f.ID)
			}
			if s.params[f.ID] && f.Metrics.ExternalTokens == 0 {
				s.st.Unloaded++
			}
			delete(s.params, f.ID)
			if !s.send(m) {
				s.st.Unsent++
			}
		}
		if !open && time.Since(ended) > bound {
			st := s.e.sched.Stats()
			return fmt.Errorf("waited %v after the coordinator ended the input for %d requests to end and %d kept requests to be released", bound, len(s.e.reqs), st.Held)
		}
	}
}

// tryRecv receives from c without blocking: more is false when nothing
// is there, ok false when c is closed.
func tryRecv(c <-chan pdMsg) (m pdMsg, ok, more bool) {
	select {
	case m, ok = <-c:
		return m, ok, true
	default:
		return m, false, false
	}
}

// handle acts on a message from the coordinator.
func (s *pdServer) handle(m pdMsg, done chan<- finished) error {
	switch m.Op {
	case "submit":
		if len(m.Params) > 0 {
			s.params[m.ID] = true
		}
		return s.e.Submit(m.ID, m.Prompt, m.MaxTokens, m.Params, done)
	case "forget":
		f, ok := s.e.conn.(interface{ Forget(string) error })
		if !ok {
			return fmt.Errorf("forget %q: the connector (%T) cannot forget a producer", m.Engine, s.e.conn)
		}
		if err := f.Forget(m.Engine); err != nil {
			return err
		}
		s.st.Forgotten++
		return nil
	}
	return fmt.Errorf("message %q from the coordinator: unknown", m.Op)
}

// pdProc is the coordinator's record of an instance process.
type pdProc struct {
	*child
	role   string
	conn   *net.UnixConn
	dec    *json.Decoder
	enc    *json.Encoder
	encErr error // the first failed write: the instance is gone
	hello  pdMsg
	bye    *pdStats
	gone   bool // its connection ended
}

// describe names the process and what it wrote on stderr, for errors.
func (p *pdProc) describe() string {
	return fmt.Sprintf("the %s instance (pid %d)%s", p.role, p.pid(), p.said())
}

// pdEvent is a message from an instance, or the end of its connection
// (gone).
type pdEvent struct {
	p    *pdProc
	m    pdMsg
	gone bool
	err  error
}

// pdKeepTimeout is the p2p keep_timeout of the instances: how long the
// prefill instance keeps a request's blocks for a decode instance that
// does not say it is done.
const pdKeepTimeout = 30 * time.Second

// runPDProcs runs the workload on a prefill instance and a decode
// instance, each a process of its own started from this binary, with the
// p2p connector over transfer engine o.PDTransfer between them. It
// returns errInstanceGone, with the run, when the decode instance ended
// mid-run (its requests count failed).
func runPDProcs(ctx context.Context, o Options) (Run, error) {
	if err := o.pdPreflight(); err != nil {
		return Run{}, err
	}
	keep := o.pdKeep
	if keep == 0 {
		keep = pdKeepTimeout
	}
	exe, err := os.Executable()
	if err != nil {
		return Run{}, err
	}
	dir, err := os.MkdirTemp("", "miniengine-pd-") // mode 0700
	if err != nil {
		return Run{}, err
	}
	defer os.RemoveAll(dir)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "pd.sock"), Net: "unix"})
	if err != nil {
		return Run{}, err
	}
	defer ln.Close()

	rep := &pdReport{transfer: o.PDTransfer}
	var procs []*pdProc
	defer func() {
		// On the way out every process has ended; one that has not
		// (an error path) is killed.
		for _, p := range procs {
			if p.conn != nil {
				p.conn.Close()
			}
			p.endWithin(0)
		}
	}()
	for _, role := range []string{rolePrefill, roleDecode} {
		cfg := pdConfig{Role: role, EngineID: fmt.Sprintf("miniengine-%s-%d-%d", role, os.Getpid(), time.Now().UnixNano()),
			Transfer: o.PDTransfer, KeepTimeout: keep, Options: o}
		js, err := json.Marshal(cfg)
		if err != nil {
			return Run{}, err
		}
		c, err := startChild(exe, pdRoleEnv+"="+role, pdSocketEnv+"="+ln.Addr().String(), pdConfigEnv+"="+string(js))
		if err != nil {
			return Run{}, fmt.Errorf("start the %s instance: %w", role, err)
		}
		procs = append(procs, &pdProc{child: c, role: role})
	}
	prefill, decode := procs[0], procs[1]
	if err := pdAccept(ctx, ln, procs); err != nil {
		return Run{}, err
	}
	rep.prefillPID, rep.decodePID = prefill.hello.PID, decode.hello.PID
	rep.prefillEngine = prefill.hello.Engine

	events := make(chan pdEvent)
	var readers sync.WaitGroup
	for _, p := range procs {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				var m pdMsg
				if err := p.dec.Decode(&m); err != nil {
					events <- pdEvent{p: p, gone: true, err: err}
					return
				}
				events <- pdEvent{p: p, m: m}
			}
		}()
	}
	defer func() {
		for _, p := range procs {
			p.conn.Close()
		}
		go func() {
			readers.Wait()
			close(events)
		}()
		for range events {
		}
	}()

	c := &pdCoord{o: o, rep: rep, prefill: prefill, decode: decode, events: events, stall: keep + time.Minute}
	st, runErr := c.run(ctx)
	endErr := c.end(ctx, &st)
	r := newRun("prefill/decode across processes", true, o.Blocks, st)
	r.pd, r.Transfer, r.Lost, r.Rerouted = rep, rep.transfer, rep.lost, rep.rerouted
	return r, errors.Join(runErr, endErr)
}

// pdPreflight checks what the instance processes need from the
// environment before any starts: Mooncake's settings, with -pd-transfer
// mooncake.
func (o Options) pdPreflight() error {
	if o.PDTransfer != p2p.TransferMooncake {
		return nil
	}
	if _, err := mooncake.ConfigFromEnv(); err != nil {
		return fmt.Errorf("%w: each instance opens a Mooncake Transfer Engine from %s (required), %s, %s and %s, loading libtransfer_engine.so from %s (else the loader's path)",
			err, mooncake.EnvLocalHostname, mooncake.EnvMetadata, mooncake.EnvProtocol, mooncake.EnvDevice, mooncake.EnvLibrary)
	}
	return nil
}

// pdAccept accepts the instances' connections and their hellos, bounded
// by a minute, or fails when an instance exits first or ctx ends.
func pdAccept(ctx context.Context, ln *net.UnixListener, procs []*pdProc) error {
	deadline := time.Now().Add(time.Minute)
	type accepted struct {
		conn  *net.UnixConn
		dec   *json.Decoder
		hello pdMsg
		err   error
	}
	acc := make(chan accepted, len(procs))
	if err := ln.SetDeadline(deadline); err != nil {
		return err
	}
	go func() {
		for range procs {
			conn, err := ln.AcceptUnix()
			if err != nil {
				acc <- accepted{err: err}
				return
			}
			// The hello is the first message; the decoder goes on
			// with the rest of the connection (it may have read ahead).
			var h pdMsg
			dec := json.NewDecoder(conn)
			err = conn.SetReadDeadline(deadline)
			if err == nil {
				err = dec.Decode(&h)
			}
			if err == nil {
				err = conn.SetReadDeadline(time.Time{})
			}
			acc <- accepted{conn: conn, dec: dec, hello: h, err: err}
		}
	}()
	pending := len(procs)
	for pending > 0 {
		// Wait for a connection, or for an instance that has not
		// connected to exit.
		cases := []reflect.SelectCase{
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(acc)},
		}
		var waiting []*pdProc
		for _, p := range procs {
			if p.conn == nil {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.exited)})
				waiting = append(waiting, p)
			}
		}
		i, v, _ := reflect.Select(cases)
		if i == 0 {
			return ctx.Err()
		}
		if i > 1 {
			p := waiting[i-2]
			return fmt.Errorf("%s exited before it connected (%v)", p.describe(), p.err)
		}
		a := v.Interface().(accepted)
		if a.err != nil {
			return fmt.Errorf("waited for the prefill and decode instances to connect: %w", a.err)
		}
		var p *pdProc
		for _, q := range procs {
			if q.role == a.hello.Role && q.conn == nil {
				p = q
			}
		}
		if a.hello.Op != "hello" || p == nil {
			a.conn.Close()
			return fmt.Errorf("an instance connected with %+v, want the hello of a prefill or decode instance", a.hello)
		}
		p.conn, p.dec, p.hello, p.enc = a.conn, a.dec, a.hello, json.NewEncoder(a.conn)
		pending--
	}
	return nil
}

// pdCoord drives the workload over the two instance processes, from one
// goroutine.
type pdCoord struct {
	o               Options
	rep             *pdReport
	prefill, decode *pdProc
	events          <-chan pdEvent
	stall           time.Duration // the longest wait for an instance's message
	prefilled       int           // requests the prefill instance ended
}

// pdReq is a request on its way through the instances.
type pdReq struct {
	k     turnKey
	added time.Time
	at    *pdProc // the instance that has it
}

// send writes m to p. A write that fails is recorded: the instance is
// gone, and its reader reports so (the requests it had are dealt with
// then).
func (c *pdCoord) send(p *pdProc, m pdMsg) {
	if p.encErr == nil {
		p.encErr = p.enc.Encode(m)
	}
}

// run drives the workload until every turn ended, or the decode instance
// is gone.
func (c *pdCoord) run(ctx context.Context) (Stats, error) {
	o, w := c.o, c.o.Workload
	vocab := o.Model.Vocab
	sys := w.system(vocab)
	history := make([][]hashing.Token, w.Sessions)
	reqs := map[connector.RequestID]*pdReq{}
	st := Stats{outputs: map[turnKey][]hashing.Token{}, prompts: map[turnKey][]hashing.Token{}, gens: map[turnKey]uint64{}}
	var ttft, tpot, later, latency time.Duration
	var nlater, ntpot int
	total := w.Sessions * w.Turns
	ended := 0
	toDecode := func(id connector.RequestID, params []byte) {
		r := reqs[id]
		r.at = c.decode
		c.send(c.decode, pdMsg{Op: "submit", ID: id, Prompt: st.prompts[r.k], MaxTokens: w.Output, Params: params})
	}
	toPrefill := func(id connector.RequestID) {
		if c.prefill.gone {
			c.rep.rerouted++
			toDecode(id, nil)
			return
		}
		r := reqs[id]
		r.at = c.prefill
		c.send(c.prefill, pdMsg{Op: "submit", ID: id, Prompt: st.prompts[r.k], MaxTokens: 1})
	}
	submit := func(s, turn int) {
		prompt := append(append(append([]hashing.Token(nil), sys...), history[s]...), w.userTokens(s, turn, vocab)...)
		history[s] = prompt[len(sys):]
		id := connector.RequestID(fmt.Sprintf("s%d-t%d", s, turn))
		k := turnKey{s, turn}
		st.PromptTokens += len(prompt)
		st.prompts[k] = prompt
		st.gens[k] = 0
		reqs[id] = &pdReq{k: k, added: time.Now()}
		toPrefill(id)
	}
	start := time.Now()
	finish := func() {
		st.Duration = time.Since(start)
		if ended > 0 {
			st.TTFT = ttft / time.Duration(ended)
			st.Latency = latency / time.Duration(ended)
		}
		if ntpot > 0 {
			st.TPOT = tpot / time.Duration(ntpot)
		}
		if nlater > 0 {
			st.LaterTTFT = later / time.Duration(nlater)
		}
	}
	for s := range w.Sessions {
		submit(s, 0)
	}
	timer := time.NewTimer(c.stall)
	defer timer.Stop()
	for ended < total {
		timer.Reset(c.stall)
		var ev pdEvent
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-timer.C:
			return st, fmt.Errorf("waited %v for a message from the prefill or decode instance, with %d of %d requests ended", c.stall, ended, total)
		case ev = <-c.events:
		}
		p, m := ev.p, ev.m
		switch {
		case ev.gone && p == c.decode:
			p.gone = true
			c.rep.lost = roleDecode
			lost := total - ended
			finish()
			st.Failed += lost
			return st, fmt.Errorf("%w: %s: its connection ended (%v) with %d of %d requests ended: the %d others count failed", errInstanceGone, p.describe(), ev.err, ended, total, lost)
		case ev.gone:
			// The prefill instance is gone: the decode instance
			// writes its loads off, and computes its requests.
			p.gone = true
			c.rep.lost = rolePrefill
			c.send(c.decode, pdMsg{Op: "forget", Engine: p.hello.Engine})
			for id, r := range reqs {
				if r.at == p {
					c.rep.rerouted++
					toDecode(id, nil)
				}
			}
		case m.Op == "bye":
			p.bye = m.Stats
		case m.Op != "done" || reqs[m.ID] == nil || reqs[m.ID].at != p:
			return st, fmt.Errorf("%s sent %q for request %q: not a request it has", p.describe(), m.Op, m.ID)
		case p == c.prefill:
			c.prefilled++
			if c.o.pdOnPrefilled != nil {
				c.o.pdOnPrefilled(c.prefilled, c.prefill.cmd.Process)
			}
			if m.Err != "" {
				// Its prefill failed: the decode instance computes it.
				c.rep.rerouted++
				toDecode(m.ID, nil)
			} else {
				toDecode(m.ID, m.Params)
			}
		default:
			r := reqs[m.ID]
			delete(reqs, m.ID)
			ended++
			k := r.k
			if m.Err != "" {
				st.Failed++
			} else {
				st.Succeeded++
			}
			st.outputs[k] = m.Out
			st.OutputTokens += len(m.Out)
			latency += time.Unix(0, m.Done).Sub(r.added)
			st.LocalTokens += m.Local
			st.ExternalTokens += m.External
			st.ComputedTokens += m.Computed
			if m.First != 0 {
				// The instances' clock is this host's: wall-clock
				// times compare across processes.
				d := time.Unix(0, m.First).Sub(r.added)
				ttft += d
				if k.Turn > 0 {
					later += d
					nlater++
				}
				if len(m.Out) > 1 {
					tpot += time.Duration(m.Done-m.First) / time.Duration(len(m.Out)-1)
					ntpot++
				}
			}
			history[k.Session] = append(history[k.Session], m.Out...)
			if c.o.pdOnEnd != nil {
				c.o.pdOnEnd(ended, c.prefill.cmd.Process, c.decode.cmd.Process)
			}
			if k.Turn+1 < w.Turns {
				submit(k.Session, k.Turn+1)
			}
		}
	}
	finish()
	return st, nil
}

// end ends the input of each instance still there and waits, for up to
// c.stall, for its bye and its exit; it returns an error for an instance
// that did not end cleanly, but for the one lost mid-run.
func (c *pdCoord) end(ctx context.Context, st *Stats) error {
	var errs []error
	for _, p := range []*pdProc{c.prefill, c.decode} {
		if !p.gone {
			if err := p.conn.CloseWrite(); err != nil {
				errs = append(errs, fmt.Errorf("end the input of %s: %w", p.describe(), err))
			}
		}
	}
	deadline := time.NewTimer(c.stall)
	defer deadline.Stop()
	for !c.prefill.gone || !c.decode.gone {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("waited %v for the instances to close their engines and say bye (prefill gone %v, decode gone %v)", c.stall, c.prefill.gone, c.decode.gone)
		case ev := <-c.events:
			switch {
			case ev.gone:
				ev.p.gone = true
			case ev.m.Op == "bye":
				ev.p.bye = ev.m.Stats
			}
			// A request the prefill instance ends now is one of a
			// lost decode instance: nobody takes it.
		}
	}
	for _, p := range []*pdProc{c.prefill, c.decode} {
		select {
		case <-p.exited:
		case <-deadline.C:
			return fmt.Errorf("waited %v for %s to exit", c.stall, p.describe())
		}
		if p.role == c.rep.lost {
			continue // killed, or crashed: the run's error says so
		}
		switch {
		case p.err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", p.describe(), p.err))
		case p.bye == nil:
			errs = append(errs, fmt.Errorf("%s exited without its bye", p.describe()))
		case p.bye.CloseErr != "":
			errs = append(errs, fmt.Errorf("%s: closing its engine: %s", p.describe(), p.bye.CloseErr))
		}
	}
	for _, p := range []*pdProc{c.prefill, c.decode} {
		if p.bye == nil {
			continue
		}
		b := *p.bye
		if p == c.prefill {
			c.rep.prefill = b
		} else {
			c.rep.decode = b
		}
		st.IdleSteps += b.IdleSteps
		st.ConnLoads += b.Worker.Loads
		st.ConnLoadBytes += b.Worker.LoadBytes
		st.ConnLoadTokens = addTokens(st.ConnLoadTokens, b.Worker)
		st.ConnSaves += b.Worker.Saves
		st.ConnFailures += b.Worker.LoadFailures + b.Sched.SaveFailures
		st.ConnCorrupt += b.Worker.Corrupt
		st.ConnNanos += b.Sched.LookupNanos + b.Worker.TransferNanos
	}
	return errors.Join(errs...)
}
