package zmtp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// SocketLimits bound what the peers of a socket may send and hold. A peer
// over a bound is disconnected and counted (Counters); a peer refused for
// Peers is closed right after it connects.
type SocketLimits struct {
	Msg Limits // each message a peer sends
	// Peers bounds the connections of a listening socket, handshakes in
	// progress included.
	Peers int
	// Idle, when > 0, bounds the time a peer may send nothing that the
	// socket needs: for a PUB, from the handshake to the peer's first
	// subscription (a subscribed peer may stay silent); for a ROUTER, before
	// each request.
	Idle time.Duration
	// Subs and SubBytes bound one PUB peer's subscriptions, in number and
	// in bytes of their prefixes; a prefix longer than SubBytes is over it.
	Subs, SubBytes int
}

// Counters count the peers a socket dropped, by cause, and the attempts of
// a connecting socket.
type Counters struct {
	Refused       uint64 // connections over SocketLimits.Peers
	Oversize      uint64 // a frame or message over SocketLimits.Msg
	Subscriptions uint64 // over SocketLimits.Subs or SubBytes
	Idle          uint64 // Idle, MsgTimeout or the handshake's time passed
	Malformed     uint64 // a handshake or message that broke ZMTP
	Connects      uint64 // connecting socket: handshakes completed
	DialFailures  uint64 // connecting socket: attempts that failed before a handshake
	Disconnected  uint64 // connecting socket: sends while it had no connection
}

type counters struct {
	refused, oversize, subscriptions, idle, malformed, connects, dialFailures, disconnected atomic.Uint64
}

func (c *counters) load() Counters {
	return Counters{
		Refused:       c.refused.Load(),
		Oversize:      c.oversize.Load(),
		Subscriptions: c.subscriptions.Load(),
		Idle:          c.idle.Load(),
		Malformed:     c.malformed.Load(),
		Connects:      c.connects.Load(),
		DialFailures:  c.dialFailures.Load(),
		Disconnected:  c.disconnected.Load(),
	}
}

// errSubscriptions ends a peer over its subscription bounds.
var errSubscriptions = fmt.Errorf("%w: too many subscriptions", ErrBound)

// Reconnection backoff of a connecting socket: the first retry after
// minBackoff (libzmq's reconnect interval), doubling to maxBackoff.
const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 10 * time.Second
)

// peer is one connection's peer with its outbound queue, written by its
// own goroutine, so that a slow peer delays nobody else. The peer of a
// connecting socket outlives its connections: its queue and
// subscriptions wait for the next one.
type peer struct {
	id string // ROUTER: the routing identity

	mu struct {
		sync.Mutex
		conn    *Conn         // nil while a connecting socket is disconnected
		gone    chan struct{} // closed when conn's writer has exited
		queue   [][][]byte
		writing bool // the writer holds messages taken from queue
		closing bool
		// PUB: subscribed prefixes with their counts, how many and their
		// bytes, and the last topic matched against them.
		subs               map[string]int
		lens               []int32 // lens[n]: how many prefixes of n bytes
		subBytes           int
		gen                uint64 // changes with subs
		lastTopic          []byte
		lastGen            uint64
		lastHit, lastValid bool
	}
	wake chan struct{} // capacity 1: the queue grew, or conn or closing changed
}

// enqueue appends msg unless the queue holds hwm messages already; it
// reports whether it did.
func (p *peer) enqueue(msg [][]byte, hwm int) bool {
	p.mu.Lock()
	if p.mu.closing || len(p.mu.queue) >= hwm {
		p.mu.Unlock()
		return false
	}
	p.mu.queue = append(p.mu.queue, msg)
	p.mu.Unlock()
	p.signal()
	return true
}

func (p *peer) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// attach makes c the peer's connection and starts its writer.
func (p *peer) attach(c *Conn) {
	gone := make(chan struct{})
	p.mu.Lock()
	p.mu.conn, p.mu.gone = c, gone
	p.mu.Unlock()
	go p.writeLoop(c, gone)
}

// detach stops c's writer, closes c and waits for the writer; what is
// queued stays queued.
func (p *peer) detach(c *Conn) {
	p.mu.Lock()
	gone := p.mu.gone
	if p.mu.conn == c {
		p.mu.conn = nil
	}
	p.mu.Unlock()
	p.signal()
	c.Close()
	<-gone
}

// writeLoop sends the queue on c until c fails, c is no longer the peer's
// connection, or the peer is closing and the queue is empty.
func (p *peer) writeLoop(c *Conn, gone chan struct{}) {
	defer close(gone)
	for {
		p.mu.Lock()
		if p.mu.conn != c {
			p.mu.Unlock()
			return
		}
		batch, closing := p.mu.queue, p.mu.closing
		p.mu.queue = nil
		p.mu.writing = len(batch) > 0
		p.mu.Unlock()
		if len(batch) == 0 {
			if closing {
				return
			}
			<-p.wake
			continue
		}
		err := p.write(c, batch)
		p.mu.Lock()
		p.mu.writing = false
		p.mu.Unlock()
		if err != nil {
			c.Close()
			return
		}
	}
}

// write writes batch to c and flushes it.
func (p *peer) write(c *Conn, batch [][][]byte) error {
	for _, m := range batch {
		if err := c.writeMsg(m); err != nil {
			return err
		}
	}
	return c.bw.Flush()
}

// subscribe applies a subscription message (0x01 or 0x00, then the
// prefix), checked against lim.
func (p *peer) subscribe(msg []byte, lim *SocketLimits) error {
	topic := string(msg[1:])
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.subs == nil {
		p.mu.subs = map[string]int{}
	}
	n, ok := p.mu.subs[topic]
	switch {
	case msg[0] == 1 && ok:
		p.mu.subs[topic] = n + 1 // a count costs no memory
	case msg[0] == 1:
		if len(p.mu.subs) >= lim.Subs || p.mu.subBytes+len(topic) > lim.SubBytes {
			return fmt.Errorf("%w: %d subscriptions of %d bytes, bounds %d and %d", errSubscriptions, len(p.mu.subs)+1, p.mu.subBytes+len(topic), lim.Subs, lim.SubBytes)
		}
		p.mu.subs[topic] = 1
		p.mu.subBytes += len(topic)
		if len(topic) >= len(p.mu.lens) {
			p.mu.lens = append(p.mu.lens, make([]int32, len(topic)+1-len(p.mu.lens))...)
		}
		p.mu.lens[len(topic)]++
		p.mu.gen++
	case n > 1:
		p.mu.subs[topic] = n - 1
	case ok:
		delete(p.mu.subs, topic)
		p.mu.subBytes -= len(topic)
		p.mu.lens[len(topic)]--
		p.mu.gen++
	}
	return nil
}

// resetSubs forgets the subscriptions, for a new connection of a
// connecting socket (its peer sends them again).
func (p *peer) resetSubs() {
	p.mu.Lock()
	p.mu.subs, p.mu.lens = nil, nil
	p.mu.subBytes = 0
	p.mu.gen++
	p.mu.Unlock()
}

// busy reports whether the peer has messages queued or being written.
func (p *peer) busy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.mu.queue) > 0 || p.mu.writing
}

func (p *peer) hasSubs() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.mu.subs) > 0
}

// subscribed reports whether a prefix of topic is subscribed. Its cost
// does not grow with the number of subscriptions: the last topic's answer
// is kept until the subscriptions change, and otherwise each prefix of
// topic whose length some subscription has is looked up in the set (at
// most len(topic)+1 lookups).
func (p *peer) subscribed(topic []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.lastValid && p.mu.lastGen == p.mu.gen && bytes.Equal(p.mu.lastTopic, topic) {
		return p.mu.lastHit
	}
	hit := false
	for n := 0; n <= len(topic) && n < len(p.mu.lens) && !hit; n++ {
		if p.mu.lens[n] > 0 {
			_, hit = p.mu.subs[string(topic[:n])]
		}
	}
	p.mu.lastTopic = append(p.mu.lastTopic[:0], topic...)
	p.mu.lastGen, p.mu.lastHit, p.mu.lastValid = p.mu.gen, hit, true
	return hit
}

// server is the half shared by Pub and Router: a listener and its peers,
// or (Pub only) one peer it connects to.
type server struct {
	typ     string
	lim     SocketLimits
	hwm     int
	log     *slog.Logger
	onMsg   func(p *peer, msg [][]byte) error // called from the peer's reader; an error drops the peer
	onJoin  func(p *peer, c *Conn) bool       // false refuses the peer
	onLeave func(p *peer)
	subs    bool         // PUB: read only subscriptions, discard the rest
	ln      net.Listener // nil for a connecting socket
	remote  string       // a connecting socket's endpoint

	wg    sync.WaitGroup
	done  chan struct{}
	drops atomic.Uint64
	cnt   counters
	mu    struct {
		sync.Mutex
		peers   map[*peer]struct{}
		pending map[net.Conn]struct{} // in their handshake
		closed  bool
	}
}

func (s *server) init() {
	s.done = make(chan struct{})
	s.mu.peers = map[*peer]struct{}{}
	s.mu.pending = map[net.Conn]struct{}{}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
}

func (s *server) listen(ctx context.Context, endpoint string) error {
	addr, err := TCPAddr(endpoint)
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("zmtp: bind %s: %w", endpoint, err)
	}
	s.ln = ln
	s.init()
	s.wg.Add(1)
	go s.acceptLoop()
	return nil
}

// Endpoint returns the bound address as tcp://host:port, the port chosen by
// the system when the endpoint asked for port 0; a connecting socket's
// endpoint as given.
func (s *server) Endpoint() string {
	if s.ln == nil {
		return s.remote
	}
	return "tcp://" + s.ln.Addr().String()
}

func (s *server) acceptLoop() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.log.Warn("zmtp: accept", "type", s.typ, "err", err)
			select {
			case <-s.done:
				return
			case <-time.After(50 * time.Millisecond): // back off from a failing listener
			}
			continue
		}
		s.mu.Lock()
		if s.mu.closed || len(s.mu.peers)+len(s.mu.pending) >= s.lim.Peers {
			closed := s.mu.closed
			s.mu.Unlock()
			nc.Close()
			if !closed {
				s.cnt.refused.Add(1)
				s.log.Debug("zmtp: peer refused: too many peers", "type", s.typ, "remote", nc.RemoteAddr().String(), "peers", s.lim.Peers)
			}
			continue
		}
		s.mu.pending[nc] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(nc)
	}
}

// handshake completes the handshake of nc, registered as pending (Close
// closes it), and counts a failure.
func (s *server) handshake(nc net.Conn) (*Conn, error) {
	c, err := Handshake(nc, s.typ, nil)
	s.mu.Lock()
	delete(s.mu.pending, nc)
	closed := s.mu.closed
	s.mu.Unlock()
	if err == nil && closed {
		err = ErrClosed
	}
	if err != nil {
		nc.Close()
		if !closed {
			s.count(err)
			s.log.Debug("zmtp: handshake", "type", s.typ, "remote", nc.RemoteAddr().String(), "err", err)
		}
		return nil, err
	}
	c.Limits = s.lim.Msg
	return c, nil
}

// count counts the end of a connection by err, when err is a peer over a
// bound or breaking the protocol (not a peer that left).
func (s *server) count(err error) {
	switch {
	case errors.Is(err, errSubscriptions):
		s.cnt.subscriptions.Add(1)
	case errors.Is(err, ErrBound):
		s.cnt.oversize.Add(1)
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.cnt.idle.Add(1)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.Is(err, ErrClosed):
		// The peer left, or the socket closed it.
	default:
		var ne *net.OpError
		if errors.As(err, &ne) && !errors.Is(err, ErrProtocol) {
			return // reset by the peer and the like
		}
		s.cnt.malformed.Add(1)
	}
}

func (s *server) serve(nc net.Conn) {
	defer s.wg.Done()
	c, err := s.handshake(nc)
	if err != nil {
		return
	}
	p := &peer{wake: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.mu.closed || (s.onJoin != nil && !s.onJoin(p, c)) {
		s.mu.Unlock()
		nc.Close()
		return
	}
	s.mu.peers[p] = struct{}{}
	p.attach(c) // under s.mu: Close sees the connection
	s.mu.Unlock()
	s.readLoop(p, c)
	// The reader is done: the peer left or broke a bound, or Close closed
	// the connection.
	s.mu.Lock()
	delete(s.mu.peers, p)
	if s.onLeave != nil {
		s.onLeave(p)
	}
	s.mu.Unlock()
	p.mu.Lock()
	p.mu.closing = true
	p.mu.Unlock()
	p.detach(c)
}

// readLoop reads c's messages for p until c ends; it counts and logs a
// peer over a bound and returns the error that ended c.
func (s *server) readLoop(p *peer, c *Conn) error {
	keep := -1
	if s.subs {
		// One byte more than a subscription may have: a longer one is
		// read, refused and counted, not discarded unseen.
		keep = 2 + s.lim.SubBytes
	}
	for {
		var deadline time.Time
		if s.lim.Idle > 0 && (!s.subs || !p.hasSubs()) {
			deadline = time.Now().Add(s.lim.Idle)
		}
		if err := c.nc.SetReadDeadline(deadline); err != nil {
			return err
		}
		// Wait for a message's first byte: past Idle, a peer that has
		// replies queued or being written (a slow reader of a long
		// replay) is given another Idle; any other is dropped.
		_, err := c.br.Peek(1)
		if errors.Is(err, os.ErrDeadlineExceeded) && p.busy() {
			continue
		}
		var msg [][]byte
		if err == nil {
			msg, err = c.readMsg(keep)
		}
		if err == nil && msg != nil {
			err = s.onMsg(p, msg)
		}
		if err != nil {
			s.mu.Lock()
			closed := s.mu.closed
			s.mu.Unlock()
			if !closed {
				s.count(err)
				s.log.Debug("zmtp: peer dropped", "type", s.typ, "remote", c.nc.RemoteAddr().String(), "err", err)
			}
			return err
		}
	}
}

// connectLoop keeps the peer p connected to s.remote until Close,
// retrying with backoff.
func (s *server) connectLoop(addr string, p *peer) {
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	backoff := minBackoff
	warned := false // the current streak of failures was logged
	for {
		ok, clean, err := s.connectOnce(ctx, addr, p)
		if ok {
			warned = false
		}
		if ok && clean {
			backoff = minBackoff
		}
		if err != nil && !warned {
			// Later failures of the streak are counted, not logged.
			s.log.Warn("zmtp: connect failed, retrying with backoff", "type", s.typ, "endpoint", s.remote, "err", err)
			warned = true
		}
		select {
		case <-s.done:
			return
		case <-time.After(backoff):
		}
		if !clean || !ok {
			backoff = min(2*backoff, maxBackoff)
		}
	}
}

// connectOnce dials, serves the connection until it ends and reports
// whether a handshake completed, whether the connection ended without the
// peer breaking a bound or the protocol, and the error of an attempt that
// failed before its handshake completed (counted).
func (s *server) connectOnce(ctx context.Context, addr string, p *peer) (ok, clean bool, err error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return false, true, nil // closing
		}
		s.cnt.dialFailures.Add(1)
		return false, false, err
	}
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		nc.Close()
		return false, true, nil
	}
	s.mu.pending[nc] = struct{}{}
	s.mu.Unlock()
	c, err := s.handshake(nc)
	if err != nil {
		if s.isClosed() {
			return false, true, nil
		}
		s.cnt.dialFailures.Add(1)
		return false, false, err
	}
	s.cnt.connects.Add(1)
	p.resetSubs()
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		c.Close()
		return true, true, nil
	}
	p.attach(c) // under s.mu: Close sees the connection
	s.mu.Unlock()
	err = s.readLoop(p, c)
	p.detach(c)
	return true, !errors.Is(err, ErrBound) && !errors.Is(err, ErrProtocol), nil
}

func (s *server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.closed
}

// close stops accepting, lets each peer's writer send what it has queued
// until linger has passed, closes every connection and waits for every
// goroutine of the server.
func (s *server) close(linger time.Duration) error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.closed = true
	for nc := range s.mu.pending {
		nc.Close()
	}
	peers := make([]*peer, 0, len(s.mu.peers))
	for p := range s.mu.peers {
		peers = append(peers, p)
	}
	s.mu.Unlock()
	var err error
	if s.ln != nil {
		err = s.ln.Close()
	}
	deadline := time.Now().Add(linger)
	var gones []chan struct{}
	for _, p := range peers {
		p.mu.Lock()
		p.mu.closing = true
		c, gone := p.mu.conn, p.mu.gone
		p.mu.Unlock()
		p.signal()
		if c != nil {
			c.nc.SetWriteDeadline(deadline)
			gones = append(gones, gone)
		}
	}
	for _, g := range gones {
		select {
		case <-g:
		case <-time.After(time.Until(deadline)):
		}
	}
	for _, p := range peers {
		p.mu.Lock()
		c := p.mu.conn
		p.mu.Unlock()
		if c != nil {
			c.Close()
		}
	}
	close(s.done)
	s.wg.Wait()
	return err
}

// Counters returns the socket's counters.
func (s *server) Counters() Counters { return s.cnt.load() }

// Pub is a PUB socket: it sends each message to every peer subscribed to a
// prefix of its first frame, dropping it for a peer whose queue holds hwm
// messages (as libzmq does). It reads only subscriptions from its peers
// and discards anything else frame by frame. Safe for concurrent use.
type Pub struct{ s server }

func newPub(hwm int, lim SocketLimits, log *slog.Logger) *Pub {
	p := &Pub{s: server{typ: "PUB", hwm: hwm, lim: lim, log: log, subs: true}}
	p.s.onMsg = func(pr *peer, msg [][]byte) error {
		// A subscription is one frame: 0x01 or 0x00, then the prefix.
		if len(msg) != 1 || len(msg[0]) == 0 || msg[0][0] > 1 {
			return nil
		}
		return pr.subscribe(msg[0], &p.s.lim)
	}
	return p
}

// ListenPub binds a PUB socket to endpoint (tcp://host:port; host * for all
// interfaces, port 0 for one the system picks). hwm > 0 bounds each peer's
// queue; lim bounds the peers (every field > 0 but Msg.MsgTimeout and
// Idle, which may be 0 for none). log may be nil.
func ListenPub(ctx context.Context, endpoint string, hwm int, lim SocketLimits, log *slog.Logger) (*Pub, error) {
	p := newPub(hwm, lim, log)
	if err := p.s.listen(ctx, endpoint); err != nil {
		return nil, err
	}
	return p, nil
}

// DialPub returns a PUB socket that connects to endpoint (tcp://host:port)
// and keeps connecting: after a failed attempt or a lost connection it
// retries after 100 ms, doubling to 10 s (back to 100 ms after a
// connection that ended without breaking a bound). Like libzmq's, its one
// peer keeps its queue (up to hwm) and subscriptions while disconnected,
// and the queue is sent on the next connection; the peer sends its
// subscriptions again, and what is sent before they arrive is not
// delivered. It returns at once: an unreachable endpoint is retried and
// counted (Counters.DialFailures), never an error.
func DialPub(endpoint string, hwm int, lim SocketLimits, log *slog.Logger) (*Pub, error) {
	addr, err := TCPAddr(endpoint)
	if err != nil {
		return nil, err
	}
	p := newPub(hwm, lim, log)
	p.s.remote = endpoint
	p.s.init()
	pr := &peer{wake: make(chan struct{}, 1)}
	p.s.mu.peers[pr] = struct{}{}
	p.s.wg.Add(1)
	go p.s.connectLoop(addr, pr)
	return p, nil
}

// Endpoint returns the bound address as tcp://host:port, or the endpoint
// a connecting socket connects to.
func (p *Pub) Endpoint() string { return p.s.Endpoint() }

// Send queues msg for every subscribed peer and returns at once; msg's
// frames must not change afterwards. It returns ErrClosed after Close.
func (p *Pub) Send(msg [][]byte) error {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	if p.s.mu.closed {
		return ErrClosed
	}
	for pr := range p.s.mu.peers {
		if p.s.ln == nil {
			pr.mu.Lock()
			disconnected := pr.mu.conn == nil
			pr.mu.Unlock()
			if disconnected {
				p.s.cnt.disconnected.Add(1)
			}
		}
		if pr.subscribed(msg[0]) && !pr.enqueue(msg, p.s.hwm) {
			p.s.drops.Add(1)
		}
	}
	return nil
}

// Subscribers returns the number of connected peers subscribed to a prefix
// of topic.
func (p *Pub) Subscribers(topic []byte) int {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	n := 0
	for pr := range p.s.mu.peers {
		pr.mu.Lock()
		connected := pr.mu.conn != nil
		pr.mu.Unlock()
		if connected && pr.subscribed(topic) {
			n++
		}
	}
	return n
}

// Drops returns how many times a message was dropped for a peer whose
// queue was full.
func (p *Pub) Drops() uint64 { return p.s.drops.Load() }

// Counters returns the peers dropped, by cause, and a connecting socket's
// attempts.
func (p *Pub) Counters() Counters { return p.s.Counters() }

// Close sends what is queued for up to linger, then closes every
// connection and waits for the socket's goroutines. It is idempotent.
func (p *Pub) Close(linger time.Duration) error { return p.s.close(linger) }

// Router is a ROUTER socket: Recv returns each message with its peer's
// routing identity as the first frame, and Send routes a message to the
// peer its first frame names. Safe for concurrent use.
type Router struct {
	s      server
	in     chan [][]byte
	nextID uint32
	ids    map[string]*peer // guarded by s.mu
}

// ListenRouter binds a ROUTER socket to endpoint, as ListenPub. Messages
// from peers wait in a queue of up to 64 messages for Recv; a peer's
// reader waits while it is full.
func ListenRouter(ctx context.Context, endpoint string, hwm int, lim SocketLimits, log *slog.Logger) (*Router, error) {
	r := &Router{s: server{typ: "ROUTER", hwm: hwm, lim: lim, log: log}, in: make(chan [][]byte, 64), ids: map[string]*peer{}}
	r.s.onJoin = func(p *peer, c *Conn) bool {
		id := string(c.Identity)
		if id == "" || id[0] == 0 || r.ids[id] != nil {
			// As libzmq: a generated identity is 0x00 then 4 bytes.
			r.nextID++
			id = string(binary.BigEndian.AppendUint32([]byte{0}, r.nextID))
		}
		p.id = id
		r.ids[id] = p
		return true
	}
	r.s.onLeave = func(p *peer) { delete(r.ids, p.id) }
	r.s.onMsg = func(p *peer, msg [][]byte) error {
		select {
		case r.in <- append([][]byte{[]byte(p.id)}, msg...):
			return nil
		case <-r.s.done:
			return ErrClosed
		}
	}
	if err := r.s.listen(ctx, endpoint); err != nil {
		return nil, err
	}
	return r, nil
}

// Endpoint returns the bound address as tcp://host:port.
func (r *Router) Endpoint() string { return r.s.Endpoint() }

// Counters returns the peers dropped, by cause.
func (r *Router) Counters() Counters { return r.s.Counters() }

// ErrCanceled is returned by Recv when its cancel channel closes.
var ErrCanceled = errors.New("zmtp: receive canceled")

// Recv blocks until a message arrives, cancel is closed (ErrCanceled) or
// the socket closes (ErrClosed). The first frame is the sender's identity.
func (r *Router) Recv(cancel <-chan struct{}) ([][]byte, error) {
	select {
	case m := <-r.in:
		return m, nil
	case <-cancel:
		return nil, ErrCanceled
	case <-r.s.done:
		return nil, ErrClosed
	}
}

// Send queues msg[1:] for the peer whose identity is msg[0] and returns at
// once. A message for a peer that is gone, or whose queue is full, is
// dropped (as libzmq's ROUTER does), and Send reports false.
func (r *Router) Send(msg [][]byte) (bool, error) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.s.mu.closed {
		return false, ErrClosed
	}
	p := r.ids[string(msg[0])]
	if p == nil {
		return false, nil
	}
	if !p.enqueue(msg[1:], r.s.hwm) {
		r.s.drops.Add(1)
		return false, nil
	}
	return true, nil
}

// Drops returns how many times a message was dropped for a peer whose
// queue was full.
func (r *Router) Drops() uint64 { return r.s.drops.Load() }

// Close closes the socket as Pub.Close does.
func (r *Router) Close(linger time.Duration) error { return r.s.close(linger) }
