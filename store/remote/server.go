package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// Defaults that [ServerOptions.EnsureDefaults] fills in.
const (
	DefaultMaxValue     = 64 << 20
	DefaultMaxBatch     = 1024
	DefaultMaxCallBytes = 64 << 20
	DefaultMaxConns     = 64
	DefaultHelloTimeout = 5 * time.Second
	DefaultFrameTimeout = 5 * time.Second
	DefaultMaxWatch     = 1 << 16
)

// ServerOptions configures a [Server]. The zero value of every field means
// its default.
type ServerOptions struct {
	// MaxValue is the largest value, in bytes, that a put may store and a
	// get may return. Default 64 MiB.
	MaxValue int
	// MaxBatch is the most keys one request carries; clients split larger
	// batches. Default 1024.
	MaxBatch int
	// MaxCallBytes is the most value bytes one put or get request moves
	// (for a get, the destinations' lengths, each cut to MaxValue); clients
	// split larger batches. It bounds the bytes one request stages: a
	// connection's staging memory fits the largest request it served
	// since it was last idle for a second (rounded up to a power of two,
	// MaxCallBytes at most), and the server's is MaxConns × MaxCallBytes
	// at most. At least MaxValue; default 64 MiB.
	MaxCallBytes int
	// MaxConns is the most connections the server serves at once (each
	// client takes up to its ClientOptions.Conns). A connection beyond it
	// is refused: the server answers its hello with an error matching
	// store.ErrUnavailable, logs a warning, and closes it; the client sees
	// the error from Dial, or as a per-key store.ErrTransfer of the call
	// that needed the connection. A refused connection has HelloTimeout
	// to send its hello, and at most MaxConns are answered at once: one
	// beyond that is closed at once, unanswered, with a debug record.
	// Default 64.
	MaxConns int
	// Secret is the shared secret that clients must prove they hold when
	// they connect, and that the server proves it holds to them (see
	// "Security" in the package doc). A server that serves a network other
	// than "unix" refuses to serve without one. If empty, EnsureDefaults
	// takes the value of the environment variable [SecretEnv]. At least
	// [MinSecretLen] bytes.
	Secret Secret
	// HelloTimeout bounds the start of a connection: the client's hello,
	// and its proof of the secret, must have arrived within it, or the
	// server closes the connection. Default 5 s.
	HelloTimeout time.Duration
	// FrameTimeout bounds a stall within a frame: once a frame has begun,
	// every MiB of it must be read or written within FrameTimeout, or the
	// server closes the connection and frees its staging memory. A
	// connection may stay idle between frames for as long as the client
	// likes. Default 5 s.
	FrameTimeout time.Duration
	// MaxWatch bounds the events the server holds for one watch of a
	// client (a client's Watch takes the smaller of its n and MaxWatch):
	// past it the server drops events, and the client's feed reports them
	// lost. Default 65536; at most store.MaxWatch.
	MaxWatch int
	// Logger receives a debug record of every connection that ends, with
	// its error when it ended in one (a torn or corrupt frame, a client
	// gone mid-call), a warning of every Accept error that Serve
	// retries, and one of every connection refused for MaxConns. Nil
	// discards them.
	Logger *slog.Logger
}

// EnsureDefaults sets every zero field of o to its default.
func (o *ServerOptions) EnsureDefaults() {
	if o.MaxValue == 0 {
		o.MaxValue = DefaultMaxValue
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.MaxCallBytes == 0 {
		o.MaxCallBytes = max(DefaultMaxCallBytes, o.MaxValue)
	}
	if o.MaxConns == 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.HelloTimeout == 0 {
		o.HelloTimeout = DefaultHelloTimeout
	}
	if o.FrameTimeout == 0 {
		o.FrameTimeout = DefaultFrameTimeout
	}
	if o.MaxWatch == 0 {
		o.MaxWatch = DefaultMaxWatch
	}
	o.Secret = secretFromEnv(o.Secret)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports the first field of o that is out of range, naming the
// field and its value. Call EnsureDefaults first.
func (o *ServerOptions) Validate() error {
	switch {
	case o.MaxValue < 1:
		return fmt.Errorf("remote: server options: MaxValue %d: must be positive", o.MaxValue)
	case o.MaxBatch < 1 || o.MaxBatch > 1<<20:
		return fmt.Errorf("remote: server options: MaxBatch %d: must be in [1, %d]", o.MaxBatch, 1<<20)
	case o.MaxCallBytes < o.MaxValue:
		return fmt.Errorf("remote: server options: MaxCallBytes %d: must be at least MaxValue %d", o.MaxCallBytes, o.MaxValue)
	case o.MaxConns < 1:
		return fmt.Errorf("remote: server options: MaxConns %d: must be positive", o.MaxConns)
	case o.HelloTimeout < 0:
		return fmt.Errorf("remote: server options: HelloTimeout %v: must be positive", o.HelloTimeout)
	case o.FrameTimeout < 0:
		return fmt.Errorf("remote: server options: FrameTimeout %v: must be positive", o.FrameTimeout)
	case o.MaxWatch < 1 || o.MaxWatch > store.MaxWatch:
		return fmt.Errorf("remote: server options: MaxWatch %d: must be in [1, %d]", o.MaxWatch, store.MaxWatch)
	}
	return checkSecret("server", o.Secret)
}

// Server serves a [store.Store] to [Client]s over stream connections. It is
// safe for concurrent use; each connection is served by goroutines of its
// own, which the Server owns and Close joins.
type Server struct {
	s      store.Store
	leases *store.Leases // nil when s is no store.Leaser
	// watcher is s when it is a store.Watcher.
	watcher store.Watcher
	staged  atomic.Int64 // bytes of staging memory held, over all connections
	opts    ServerOptions
	log     *slog.Logger
	base    context.Context // canceled by Close: the context of every inner call
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu struct {
		sync.Mutex
		closed    bool
		listeners map[net.Listener]struct{}
		conns     map[net.Conn]struct{} // served and being refused
		served    int                   // connections served, at most MaxConns
		refusing  int                   // connections being refused, at most MaxConns
	}
}

// NewServer returns a server of s. It fills in opts' defaults and returns
// an error naming the field and value that are out of range, and one for
// a nil s (a server of no store would fail every call). The server does
// not close s.
func NewServer(s store.Store, opts ServerOptions) (*Server, error) {
	if s == nil {
		return nil, errors.New("remote: NewServer: the store is nil")
	}
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	srv := &Server{s: s, opts: opts, log: opts.Logger}
	if l, ok := s.(store.Leaser); ok {
		ls := l.Leases()
		srv.leases = &ls
	}
	srv.watcher, _ = s.(store.Watcher)
	srv.base, srv.cancel = context.WithCancel(context.Background())
	srv.mu.listeners = make(map[net.Listener]struct{})
	srv.mu.conns = make(map[net.Conn]struct{})
	return srv, nil
}

// ErrServerClosed is returned by [Server.Serve] after [Server.Close].
var ErrServerClosed = errors.New("remote: server closed")

// Serve accepts connections on l and serves each until it ends, and
// returns when l fails or the server is closed ([ErrServerClosed]). It
// refuses at once, with an error that says why, a listener of a network
// other than "unix" when the server has no [ServerOptions.Secret]. An
// Accept error that is temporary (such as no file descriptor free) is
// logged and Accept retried, after 5 ms, doubling up to 1 s while the
// errors last; any other ends Serve. It closes l when it returns. It may
// be called for several listeners at once.
func (srv *Server) Serve(l net.Listener) error {
	if a := l.Addr(); needsSecret(a.Network()) && len(srv.opts.Secret) == 0 {
		return errors.Join(fmt.Errorf("remote: serve %s %s: refused: a %s listener needs a shared secret (ServerOptions.Secret or %s), as only a unix socket is kept to its owner", a.Network(), a, a.Network(), SecretEnv), l.Close())
	}
	srv.mu.Lock()
	if srv.mu.closed {
		srv.mu.Unlock()
		return errors.Join(ErrServerClosed, l.Close())
	}
	srv.mu.listeners[l] = struct{}{}
	srv.mu.Unlock()
	defer func() {
		srv.mu.Lock()
		delete(srv.mu.listeners, l)
		srv.mu.Unlock()
	}()
	var delay time.Duration // before the next Accept, after a temporary error
	for {
		nc, err := l.Accept()
		if err != nil {
			srv.mu.Lock()
			closed := srv.mu.closed
			srv.mu.Unlock()
			if !closed && temporary(err) {
				delay = min(max(2*delay, acceptDelay), maxAcceptDelay)
				srv.log.Warn("remote: accept failed; retrying", "err", err, "delay", delay)
				if srv.pause(delay) {
					continue
				}
				closed = true
			}
			cerr := l.Close()
			if closed {
				return ErrServerClosed
			}
			if errors.Is(cerr, net.ErrClosed) {
				cerr = nil
			}
			return errors.Join(fmt.Errorf("remote: accept: %w", err), cerr)
		}
		delay = 0
		srv.mu.Lock()
		if srv.mu.closed {
			srv.mu.Unlock()
			_ = nc.Close() // refused: the server is closed
			continue
		}
		refused := srv.mu.served >= srv.opts.MaxConns
		if refused && srv.mu.refusing >= srv.opts.MaxConns {
			srv.mu.Unlock()
			_ = nc.Close() // refused unanswered: MaxConns refusals are under way
			srv.log.Debug("remote: connection closed unanswered: the server serves MaxConns connections and refuses as many", "remote", nc.RemoteAddr().String(), "max_conns", srv.opts.MaxConns)
			continue
		}
		srv.mu.conns[nc] = struct{}{}
		if refused {
			srv.mu.refusing++
		} else {
			srv.mu.served++
		}
		srv.wg.Add(1)
		srv.mu.Unlock()
		go func() {
			defer srv.wg.Done()
			if refused {
				srv.refuse(nc)
				srv.mu.Lock()
				delete(srv.mu.conns, nc)
				srv.mu.refusing--
				srv.mu.Unlock()
				return
			}
			err := srv.serveConn(nc)
			srv.mu.Lock()
			delete(srv.mu.conns, nc)
			srv.mu.served--
			srv.mu.Unlock()
			srv.log.Debug("remote: connection ended", "remote", nc.RemoteAddr().String(), "err", err)
		}()
	}
}

// refuse answers the hello of nc, a connection beyond MaxConns, with an
// error matching store.ErrUnavailable, closes it, and logs a warning,
// with the error of the exchange if the client could not be told.
func (srv *Server) refuse(nc net.Conn) {
	err := srv.refuseHello(nc)
	if cerr := nc.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
		err = errors.Join(err, cerr)
	}
	srv.log.Warn("remote: connection refused: the server serves MaxConns connections", "remote", nc.RemoteAddr().String(), "max_conns", srv.opts.MaxConns, "err", err)
}

func (srv *Server) refuseHello(nc net.Conn) error {
	if err := nc.SetDeadline(time.Now().Add(srv.opts.HelloTimeout)); err != nil {
		return err
	}
	var hdr [headerLen]byte
	if _, err := io.ReadFull(nc, hdr[:]); err != nil {
		return err
	}
	h, err := parseHeader(hdr[:], nonceLen)
	if err != nil {
		return err
	}
	if h.typ != msgHello || h.data != 0 || h.body != nonceLen {
		return fmt.Errorf("%w: first frame of type %d, want a hello", errFrame, h.typ)
	}
	crc := crc32Of(hdr[:])
	var nc0 [nonceLen]byte
	if err := readFull(nc, nc0[:], &crc); err != nil {
		return err
	}
	if err := readTrailer(nc, crc); err != nil {
		return err
	}
	msg := fmt.Sprintf("remote: connection refused: the server serves %d connections, its MaxConns", srv.opts.MaxConns)
	body := enc(nil).u8(codeUnavailable).str(msg).u64(0).u32(0)
	putHeader(hdr[:], header{typ: msgReply, id: h.id, body: uint32(len(body))})
	var bufs net.Buffers
	return writeFrame(nc, &bufs, hdr[:], body, nil)
}

// The delays before Serve retries Accept after a temporary error: the
// first, doubled after each error in a row up to the last.
const (
	acceptDelay    = 5 * time.Millisecond
	maxAcceptDelay = time.Second
)

// temporary reports whether err, an Accept error, may pass: it says so,
// as net's errors do for EMFILE, ENFILE, ECONNABORTED and the like.
func temporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// pause waits d, and reports false if the server was closed meanwhile.
func (srv *Server) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-srv.base.Done():
		return false
	}
}

// Close closes every listener and connection of the server, cancels the
// calls into the store that are running, and waits for them and for every
// goroutine of the server. It does not close the store. Close is
// idempotent.
func (srv *Server) Close() error {
	srv.mu.Lock()
	srv.mu.closed = true
	var errs []error
	for l := range srv.mu.listeners {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for nc := range srv.mu.conns {
		if err := nc.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	srv.mu.Unlock()
	srv.cancel()
	srv.wg.Wait()
	return errors.Join(errs...)
}

// sconn is the state of one served connection.
type sconn struct {
	srv *Server
	nc  net.Conn
	// rd reads the rest of a frame past its header: nc itself during the
	// hello, under the hello's deadline; then a stallReader.
	rd io.Reader
	// established is set once the hello is done, before the reader is
	// resumed: the reader then waits for a frame's first byte without a
	// deadline, and for the rest within FrameTimeout.
	established bool
	chunks      net.Buffers // a write's chunk
	hdr         [headerLen]byte
	body        []byte
	out         enc
	bufs        net.Buffers
	mem         *rdma.HostMemory // staging memory; nil until a call needs it, and once idle
	idle        *time.Timer      // frees mem when no request comes for stageIdle
	keys        []string
	regs        []rdma.Region
	res         []store.Result

	// next carries the headers the reader goroutine reads, and the error
	// that ends it; resume tells it that the main loop has read the rest
	// of the frame. The reader handles cancel frames itself.
	next   chan frameOrErr
	resume chan struct{}
	quit   chan struct{} // closed when the main loop returns

	mu struct {
		sync.Mutex
		id     uint32             // call running
		cancel context.CancelFunc // its cancellation; nil when none runs
		// pending is the call id of the last cancel frame read while no
		// call of that id ran, when pendingSet: the next call takes it, and
		// is canceled at once if it is that id.
		pending    uint32
		pendingSet bool
	}
}

type frameOrErr struct {
	h   header
	err error
}

func (srv *Server) maxBody() uint32 {
	return uint32(16 + srv.opts.MaxBatch*(2+store.MaxKeyLen+8))
}

// serveConn serves one connection until it ends, and returns why, nil
// when the client or the server closed it between frames.
func (srv *Server) serveConn(nc net.Conn) error {
	c := &sconn{srv: srv, nc: nc, rd: nc, next: make(chan frameOrErr), resume: make(chan struct{}), quit: make(chan struct{})}
	if err := nc.SetDeadline(time.Now().Add(srv.opts.HelloTimeout)); err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Go(c.read)
	err := c.loop()
	close(c.quit)
	_ = nc.Close() // ends the reader; its error is err's cause or none
	wg.Wait()
	c.freeStage()
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		err = nil // the client or the server closed it between frames
	}
	return err
}

// read reads frame headers: it cancels calls for cancel frames, and hands
// every other header to the main loop, waiting for it to read the rest of
// the frame before it reads on.
func (c *sconn) read() {
	var hdr [headerLen]byte
	for {
		h, err := c.readHeader(hdr[:])
		if err == nil && h.typ == msgCancel {
			err = c.readCancel(h, hdr[:])
			if err == nil {
				continue
			}
		}
		if err != nil {
			c.cancelCall(0, true) // the client is gone: nobody waits for the call
		}
		select {
		case c.next <- frameOrErr{h: h, err: err}:
		case <-c.quit:
			return
		}
		if err != nil {
			return
		}
		select {
		case <-c.resume:
		case <-c.quit:
			return
		}
	}
}

func (c *sconn) readHeader(hdr []byte) (header, error) {
	if !c.established {
		// The hello's: within the deadline serveConn set.
		if _, err := io.ReadFull(c.nc, hdr); err != nil {
			return header{}, err
		}
		return parseHeader(hdr, nonceLen)
	}
	// Between frames the connection may be idle for ever; once a frame
	// has begun, its header must come within FrameTimeout.
	if err := c.nc.SetReadDeadline(time.Time{}); err != nil {
		return header{}, err
	}
	if _, err := io.ReadFull(c.nc, hdr[:1]); err != nil {
		return header{}, err
	}
	if _, err := io.ReadFull(c.stall(), hdr[1:]); err != nil {
		return header{}, c.stalled(midFrame(err))
	}
	return parseHeader(hdr, c.srv.maxBody())
}

// establish ends the hello: the reader, once resumed, and the rest of the
// frames take the deadlines of an established connection.
func (c *sconn) establish() {
	c.established = true
	c.rd = c.stall()
}

// stall returns the reader of the rest of a frame once the hello is done.
func (c *sconn) stall() io.Reader { return stallReader{c.nc, c.srv.opts.FrameTimeout} }

// stalled names FrameTimeout in the error of a read or write that timed
// out within a frame.
func (c *sconn) stalled(err error) error {
	if isTimeout(err) {
		return fmt.Errorf("remote: the frame stalled for FrameTimeout %v: %w", c.srv.opts.FrameTimeout, err)
	}
	return err
}

// readChunk is the most a stalled read or write may move before its
// deadline is pushed back: a frame must move a MiB every FrameTimeout.
const readChunk = 1 << 20

// stallReader reads from nc with a deadline of d from each read.
type stallReader struct {
	nc net.Conn
	d  time.Duration
}

func (r stallReader) Read(p []byte) (int, error) {
	if len(p) > readChunk {
		p = p[:readChunk]
	}
	if err := r.nc.SetReadDeadline(time.Now().Add(r.d)); err != nil {
		return 0, err
	}
	return r.nc.Read(p)
}

func (c *sconn) readCancel(h header, hdr []byte) error {
	if h.body != 0 || h.data != 0 {
		return fmt.Errorf("%w: cancel with a body", errFrame)
	}
	crc := crc32Of(hdr)
	if err := readTrailer(c.stall(), crc); err != nil {
		return c.stalled(err)
	}
	c.cancelCall(h.id, false)
	return nil
}

// cancelCall cancels the running call if it is id, or any if all. A
// cancel that arrives before its call starts is kept for startCall.
func (c *sconn) cancelCall(id uint32, all bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.cancel != nil && (all || c.mu.id == id) {
		c.mu.cancel()
		return
	}
	if !all {
		c.mu.pending, c.mu.pendingSet = id, true
	}
}

// loop serves requests until the connection fails or a frame is bad.
func (c *sconn) loop() error {
	if err := c.hello(); err != nil {
		if isTimeout(err) {
			err = fmt.Errorf("remote: no hello within HelloTimeout %v: %w", c.srv.opts.HelloTimeout, err)
		}
		return err
	}
	for {
		h, err := c.nextFrame()
		if err != nil {
			return err
		}
		if err := c.serve(h); err != nil {
			return err
		}
	}
}

// stageIdle is how long a connection that holds staging memory waits for
// a request before it frees the memory: a client that stops, or calls
// rarely, holds none.
const stageIdle = time.Second

// nextFrame returns the header of the next frame the reader took, or why
// there is none. It frees the staging memory once no frame came for
// stageIdle.
func (c *sconn) nextFrame() (header, error) {
	var idle <-chan time.Time
	if c.mem != nil {
		if c.idle == nil {
			c.idle = time.NewTimer(stageIdle)
		} else {
			c.idle.Reset(stageIdle)
		}
		defer c.idle.Stop()
		idle = c.idle.C
	}
	for {
		select {
		case f := <-c.next:
			return f.h, f.err
		case <-c.srv.base.Done():
			return header{}, net.ErrClosed
		case <-idle:
			c.freeStage()
			idle = nil
		}
	}
}

// hello answers the client's hello, the first frame of a connection, and
// checks its proof of the shared secret when the server has one. It runs
// under the deadline serveConn set: HelloTimeout from the connection's
// start.
func (c *sconn) hello() error {
	h, err := c.nextFrame()
	if err != nil {
		return err
	}
	if h.typ != msgHello || h.body != nonceLen || h.data != 0 {
		return fmt.Errorf("%w: first frame of type %d with a body of %d bytes, want a hello", errFrame, h.typ, h.body)
	}
	crc := c.crcHeader(h)
	if err := c.readBody(h, &crc); err != nil {
		return err
	}
	if err := readTrailer(c.rd, crc); err != nil {
		return err
	}
	clientNonce := append([]byte(nil), c.body...)
	serverNonce := nonce()
	secret := c.srv.opts.Secret
	if len(secret) == 0 {
		c.establish()
	}
	c.resumeReader()
	o := c.srv.opts
	b := enc(c.out[:0]).u64(uint64(o.MaxValue)).u32(uint32(o.MaxBatch)).u64(uint64(o.MaxCallBytes))
	var ls store.Leases
	if c.srv.leases != nil {
		ls = *c.srv.leases
		b = b.u8(1)
	} else {
		b = b.u8(0)
	}
	b = b.u8(boolByte(ls.Exists)).u8(boolByte(ls.Get)).u64(uint64(ls.TTL)).u64(uint64(ls.RemoveWait))
	b = b.u8(boolByte(c.srv.watcher != nil))
	b = append(b, serverNonce...)
	if len(secret) != 0 {
		b = append(b.u8(1), proof(secret, labelServer, clientNonce, serverNonce)...)
	} else {
		b = b.u8(0)
	}
	c.out = b
	if err := c.reply(msgHelloReply, h.id, nil); err != nil {
		return err
	}
	if len(secret) != 0 {
		if err := c.auth(secret, clientNonce, serverNonce); err != nil {
			return err
		}
	}
	// The hello is done: from now on the connection may be idle between
	// frames, and a frame must not stall. Each read and write sets its own
	// deadline (readHeader, stallReader, stallWriter), the reader's
	// included, which may be reading the next header already.
	return nil
}

// auth reads the client's proof of the secret and answers it: a wrong
// proof is answered with an error, and ends the connection.
func (c *sconn) auth(secret, clientNonce, serverNonce []byte) error {
	h, err := c.nextFrame()
	if err != nil {
		return fmt.Errorf("remote: the client sent no proof of the shared secret: %w", err)
	}
	if h.typ != msgAuth || h.body != proofLen || h.data != 0 {
		return fmt.Errorf("%w: frame of type %d with a body of %d bytes after the hello, want the client's proof of the shared secret", errFrame, h.typ, h.body)
	}
	crc := c.crcHeader(h)
	if err := c.readBody(h, &crc); err != nil {
		return err
	}
	if err := readTrailer(c.rd, crc); err != nil {
		return err
	}
	var refused error
	if !checkProof(c.body, secret, labelClient, clientNonce, serverNonce) {
		refused = fmt.Errorf("%w: remote: connection refused: the client's proof of the shared secret is wrong (the secrets differ, or the hello was replayed)", store.ErrUnavailable)
	} else {
		c.establish()
	}
	c.resumeReader()
	c.out = callReply(c.out[:0], refused, 0, nil)
	if err := c.reply(msgReply, h.id, nil); err != nil {
		return errors.Join(refused, err)
	}
	if refused != nil {
		c.srv.log.Warn("remote: connection refused: wrong proof of the shared secret", "remote", c.nc.RemoteAddr().String())
	}
	return refused
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func (c *sconn) resumeReader() { c.resume <- struct{}{} }

// crcHeader re-encodes h, the header the reader parsed, and returns its
// checksum: the start of the frame's running checksum. The bytes are the
// ones read, as parseHeader refused any other.
func (c *sconn) crcHeader(h header) uint32 {
	putHeader(c.hdr[:], h)
	return crc32Of(c.hdr[:])
}

// readBody reads the body of the frame of h into c.body, adding it to crc.
func (c *sconn) readBody(h header, crc *uint32) error {
	if cap(c.body) < int(h.body) {
		c.body = make([]byte, h.body)
	}
	c.body = c.body[:h.body]
	return c.stalled(readFull(c.rd, c.body, crc))
}

// serve serves one request whose header is h.
func (c *sconn) serve(h header) error {
	crc := c.crcHeader(h)
	if err := c.readBody(h, &crc); err != nil {
		return err
	}
	switch h.typ {
	case msgPut:
		return c.put(h, crc)
	case msgGet, msgExists, msgRemove, msgRemovePrefix, msgRemoveAll, msgStats, msgWatch:
		if h.data != 0 {
			return fmt.Errorf("%w: request of type %d with %d data bytes", errFrame, h.typ, h.data)
		}
		if err := readTrailer(c.rd, crc); err != nil {
			return c.stalled(err)
		}
	default:
		return fmt.Errorf("%w: request of type %d", errFrame, h.typ)
	}
	c.resumeReader()
	switch h.typ {
	case msgGet:
		return c.get(h)
	case msgExists:
		return c.exists(h)
	case msgWatch:
		return c.watch(h)
	case msgStats:
		st := c.srv.s.Stats()
		b := enc(c.out[:0])
		for _, v := range []int64{st.Keys, st.Bytes, st.Capacity, st.Hits, st.Misses, st.Exists, st.Puts, st.Duplicates, st.RejectedPuts, st.Evictions, st.BytesIn, st.BytesOut} {
			b = b.u64(uint64(v))
		}
		c.out = b
		return c.reply(msgStatsReply, h.id, nil)
	}
	d := dec{b: c.body}
	var key string
	if h.typ != msgRemoveAll {
		key = d.str()
	}
	if err := d.end(); err != nil {
		return err
	}
	ctx, done := c.startCall(h.id)
	var n int
	var err error
	switch h.typ {
	case msgRemove:
		err = c.srv.s.Remove(ctx, key)
	case msgRemovePrefix:
		n, err = c.srv.s.RemovePrefix(ctx, key)
	case msgRemoveAll:
		n, err = c.srv.s.RemoveAll(ctx)
	}
	done()
	c.out = callReply(c.out[:0], err, n, nil)
	return c.reply(msgReply, h.id, nil)
}

// startCall makes the context of call id, which a cancel frame, the
// client's going or the server's Close cancels; done ends it. A cancel
// read before the call started cancels it if it names id; one that names
// another id came after that call's reply, and is dropped: the client
// sends a call's cancel only after its request.
func (c *sconn) startCall(id uint32) (ctx context.Context, done func()) {
	ctx, cancel := context.WithCancel(c.srv.base)
	c.mu.Lock()
	c.mu.id, c.mu.cancel = id, cancel
	if c.mu.pendingSet && c.mu.pending == id {
		cancel()
	}
	c.mu.pendingSet = false
	c.mu.Unlock()
	return ctx, func() {
		c.mu.Lock()
		c.mu.cancel = nil
		c.mu.Unlock()
		cancel()
	}
}

// callReply encodes a reply body: the call's error, the count, and res.
func callReply(b enc, err error, n int, res []store.Result) enc {
	b = b.u8(codeOf(err))
	if err != nil {
		b = b.str(message(err))
	} else {
		b = b.str("")
	}
	b = b.u64(uint64(n)).u32(uint32(len(res)))
	for _, r := range res {
		code := codeOf(r.Err)
		b = b.u8(code).u64(uint64(r.N))
		if code != codeOK {
			b = b.str(message(r.Err))
		}
	}
	return b
}

// reply writes a frame of c.out and data.
func (c *sconn) reply(typ byte, id uint32, data [][]byte) error {
	var total uint64
	for _, d := range data {
		total += uint64(len(d))
	}
	var hdr [headerLen]byte
	putHeader(hdr[:], header{typ: typ, id: id, body: uint32(len(c.out)), data: total})
	if !c.established {
		return writeFrame(c.nc, &c.bufs, hdr[:], c.out, data) // within the hello's deadline
	}
	return c.stalled(writeFrame(stallWriter{c}, &c.bufs, hdr[:], c.out, data))
}

// stallWriter writes a frame to its connection a MiB at a time, each
// within FrameTimeout: a client that stops reading a reply ends its
// connection, and frees its staging memory.
type stallWriter struct{ c *sconn }

// WriteBuffers writes bufs in vectored writes of readChunk bytes at most.
func (w stallWriter) writeBuffers(bufs net.Buffers) error {
	c := w.c
	for len(bufs) > 0 {
		part, n := c.chunks[:0], 0
		for len(bufs) > 0 && n < readChunk {
			b := bufs[0]
			if k := readChunk - n; len(b) > k {
				part = append(part, b[:k])
				bufs[0] = b[k:]
				n += k
				break
			}
			part = append(part, b)
			n += len(b)
			bufs = bufs[1:]
		}
		c.chunks = part[:0]
		if err := c.nc.SetWriteDeadline(time.Now().Add(c.srv.opts.FrameTimeout)); err != nil {
			return err
		}
		if _, err := part.WriteTo(c.nc); err != nil {
			return err
		}
	}
	return nil
}

func (w stallWriter) Write(p []byte) (int, error) {
	if err := w.writeBuffers(net.Buffers{p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// keysOf decodes n keys, each followed by a u64 when sized, into c.keys
// and the sizes into sizes.
func (c *sconn) decodeKeys(d *dec, sized bool) ([]string, []uint64, error) {
	n := int(d.u32())
	if d.err == nil && (n < 1 || n > c.srv.opts.MaxBatch) {
		return nil, nil, fmt.Errorf("%w: batch of %d keys, want 1 to %d", errFrame, n, c.srv.opts.MaxBatch)
	}
	keys := c.keys[:0]
	var sizes []uint64
	for range n {
		keys = append(keys, d.str())
		if sized {
			sizes = append(sizes, d.u64())
		}
	}
	c.keys = keys
	return keys, sizes, d.end()
}

func (c *sconn) results(n int) []store.Result {
	if cap(c.res) < n {
		c.res = make([]store.Result, n)
	}
	c.res = c.res[:n]
	clear(c.res)
	return c.res
}

func (c *sconn) exists(h header) error {
	d := dec{b: c.body}
	keys, _, err := c.decodeKeys(&d, false)
	if err != nil {
		return err
	}
	res := c.results(len(keys))
	ctx, done := c.startCall(h.id)
	err = c.srv.s.Exists(ctx, keys, res)
	done()
	if err != nil {
		res = nil
	}
	c.out = callReply(c.out[:0], err, 0, res)
	return c.reply(msgReply, h.id, nil)
}

// put reads a put's values into staging memory, checks the frame's
// checksum, and only then stores them.
func (c *sconn) put(h header, crc uint32) error {
	d := dec{b: c.body}
	keys, sizes, err := c.decodeKeys(&d, true)
	if err != nil {
		return err
	}
	var total uint64
	for i, sz := range sizes {
		if sz < 1 || sz > uint64(c.srv.opts.MaxValue) {
			return fmt.Errorf("%w: put %.64q: value of %d bytes, want 1 to %d", errFrame, keys[i], sz, c.srv.opts.MaxValue)
		}
		total += sz
	}
	if total != h.data || total > uint64(c.srv.opts.MaxCallBytes) {
		return fmt.Errorf("%w: put of %d value bytes in %d data bytes, at most %d allowed", errFrame, total, h.data, c.srv.opts.MaxCallBytes)
	}
	mem, err := c.staging(int(total))
	if err != nil {
		// Nothing is read: the frame's data cannot be skipped safely, so
		// the connection ends after the reply.
		c.out = callReply(c.out[:0], err, 0, nil)
		return errors.Join(err, c.reply(msgReply, h.id, nil))
	}
	if err := readFull(c.rd, mem.Bytes()[:total], &crc); err != nil {
		return c.stalled(err)
	}
	if err := readTrailer(c.rd, crc); err != nil {
		err = c.stalled(err)
		c.out = callReply(c.out[:0], fmt.Errorf("%w: remote: put of %d keys refused: %v", store.ErrTransfer, len(keys), err), 0, nil)
		return errors.Join(err, c.reply(msgReply, h.id, nil))
	}
	c.resumeReader()
	base := mem.Region()
	regs := c.regs[:0]
	off := 0
	for _, sz := range sizes {
		r, _ := base.Sub(off, int(sz)) // inside: total fits the staging memory
		regs = append(regs, r)
		off += int(sz)
	}
	c.regs = regs
	res := c.results(len(keys))
	ctx, done := c.startCall(h.id)
	err = c.srv.s.Put(ctx, keys, regs, res)
	done()
	if err != nil {
		res = nil
	}
	c.out = callReply(c.out[:0], err, 0, res)
	return c.reply(msgReply, h.id, nil)
}

// get gets values into staging memory, then sends the results and the
// values found.
func (c *sconn) get(h header) error {
	d := dec{b: c.body}
	keys, caps, err := c.decodeKeys(&d, true)
	if err != nil {
		return err
	}
	maxv := uint64(c.srv.opts.MaxValue)
	var total uint64
	for i, n := range caps {
		if n < 1 {
			return fmt.Errorf("%w: get %.64q: destination of %d bytes", errFrame, keys[i], n)
		}
		total += min(n, maxv)
	}
	if total > uint64(c.srv.opts.MaxCallBytes) {
		return fmt.Errorf("%w: get of %d staged bytes, at most %d allowed", errFrame, total, c.srv.opts.MaxCallBytes)
	}
	res := c.results(len(keys))
	mem, err := c.staging(int(total))
	if err != nil {
		c.out = callReply(c.out[:0], err, 0, nil)
		return c.reply(msgReply, h.id, nil)
	}
	base := mem.Region()
	regs := c.regs[:0]
	off := 0
	for _, n := range caps {
		r, _ := base.Sub(off, int(min(n, maxv)))
		regs = append(regs, r)
		off += r.Len
	}
	c.regs = regs
	ctx, done := c.startCall(h.id)
	err = c.srv.s.Get(ctx, keys, regs, res)
	done()
	if err != nil {
		c.out = callReply(c.out[:0], err, 0, nil)
		return c.reply(msgReply, h.id, nil)
	}
	data := make([][]byte, 0, len(keys))
	buf := mem.Bytes()
	for i, r := range res {
		switch {
		case r.Err == nil && (r.N < 1 || r.N > regs[i].Len):
			res[i] = store.Result{Err: fmt.Errorf("%w: remote: get %.64q: the store reported %d bytes of a %d-byte destination", store.ErrTransfer, keys[i], r.N, regs[i].Len)}
		case r.Err == nil:
			o := int(regs[i].Addr - base.Addr)
			data = append(data, buf[o:o+r.N])
		case errors.Is(r.Err, store.ErrBufferTooSmall) && caps[i] > maxv:
			res[i].Err = fmt.Errorf("%w: remote: get %.64q: the value is larger than the server's MaxValue %d", store.ErrTransfer, keys[i], maxv)
		}
	}
	c.out = callReply(c.out[:0], nil, 0, res)
	return c.reply(msgReply, h.id, data)
}

// staging returns host memory of at least n bytes, registered with the
// store, growing the connection's memory when it is too small.
func (c *sconn) staging(n int) (*rdma.HostMemory, error) {
	if c.mem != nil && c.mem.Len() >= n {
		return c.mem, nil
	}
	size := 64 << 10
	for size < n {
		size *= 2
	}
	size = min(size, max(n, c.srv.opts.MaxCallBytes))
	c.freeStage()
	mem, err := rdma.AllocHost(size)
	if err != nil {
		return nil, fmt.Errorf("%w: remote: staging memory: %v", store.ErrNoSpace, err)
	}
	if err := c.srv.s.Register(mem.Region()); err != nil {
		return nil, errors.Join(fmt.Errorf("remote: register staging memory: %w", err), mem.Free())
	}
	c.mem = mem
	c.srv.staged.Add(int64(mem.Len()))
	return mem, nil
}

// freeStage unregisters and frees the staging memory, if any.
func (c *sconn) freeStage() {
	if c.mem == nil {
		return
	}
	if err := c.srv.s.Unregister(c.mem.Region()); err != nil && !errors.Is(err, store.ErrClosed) {
		c.srv.log.Debug("remote: unregister staging memory", "err", err)
	}
	c.srv.staged.Add(-int64(c.mem.Len()))
	if err := c.mem.Free(); err != nil {
		c.srv.log.Debug("remote: free staging memory", "err", err)
	}
	c.mem = nil
}

// writeFrame writes a frame of hdr, body and data in one vectored write,
// with the trailer's checksum over all of them.
func writeFrame(w io.Writer, bufs *net.Buffers, hdr, body []byte, data [][]byte) error {
	crc := crc32Of(hdr)
	crc = updateCRC(crc, body)
	for _, d := range data {
		crc = updateCRC(crc, d)
	}
	var tr [trailerLen]byte
	tr[0], tr[1], tr[2], tr[3] = byte(crc), byte(crc>>8), byte(crc>>16), byte(crc>>24)
	b := (*bufs)[:0]
	b = append(b, hdr, body)
	b = append(b, data...)
	b = append(b, tr[:])
	*bufs = b[:0]
	if bw, ok := w.(interface{ writeBuffers(net.Buffers) error }); ok {
		return bw.writeBuffers(b)
	}
	_, err := b.WriteTo(w)
	return err
}
