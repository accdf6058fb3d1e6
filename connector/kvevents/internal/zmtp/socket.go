package zmtp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// peer is one accepted connection with its outbound queue, written by its
// own goroutine, so that a slow peer delays nobody else.
type peer struct {
	conn *Conn
	id   string // ROUTER: the routing identity

	mu struct {
		sync.Mutex
		queue   [][][]byte
		closing bool
		subs    map[string]int // PUB: subscribed prefixes, with counts
	}
	wake chan struct{} // capacity 1: the queue grew or closing was set
	gone chan struct{} // closed when the writer has exited
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
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return true
}

// writeLoop sends the queue until the peer closes, or until it is closing
// and the queue is empty.
func (p *peer) writeLoop() {
	defer close(p.gone)
	for {
		p.mu.Lock()
		batch, closing := p.mu.queue, p.mu.closing
		p.mu.queue = nil
		p.mu.Unlock()
		if len(batch) == 0 {
			if closing {
				return
			}
			<-p.wake
			continue
		}
		for _, m := range batch {
			if err := p.conn.writeMsg(m); err != nil {
				p.conn.Close()
				return
			}
		}
		if err := p.conn.bw.Flush(); err != nil {
			p.conn.Close()
			return
		}
	}
}

// server is the listening half shared by Pub and Router.
type server struct {
	typ     string
	ln      net.Listener
	hwm     int
	log     *slog.Logger
	onMsg   func(p *peer, msg [][]byte) // called from the peer's reader
	onJoin  func(p *peer) bool          // false refuses the peer
	onLeave func(p *peer)

	wg    sync.WaitGroup
	done  chan struct{}
	drops atomic.Uint64
	mu    struct {
		sync.Mutex
		peers   map[*peer]struct{}
		pending map[net.Conn]struct{} // in their handshake
		closed  bool
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
	s.done = make(chan struct{})
	s.mu.peers = map[*peer]struct{}{}
	s.mu.pending = map[net.Conn]struct{}{}
	s.wg.Add(1)
	go s.acceptLoop()
	return nil
}

// Endpoint returns the bound address as tcp://host:port, the port chosen by
// the system when the endpoint asked for port 0.
func (s *server) Endpoint() string { return "tcp://" + s.ln.Addr().String() }

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
		s.wg.Add(1)
		go s.serve(nc)
	}
}

func (s *server) serve(nc net.Conn) {
	defer s.wg.Done()
	// close closes nc if the server closes during the handshake.
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		nc.Close()
		return
	}
	s.mu.pending[nc] = struct{}{}
	s.mu.Unlock()
	c, err := Handshake(nc, s.typ, nil)
	s.mu.Lock()
	delete(s.mu.pending, nc)
	s.mu.Unlock()
	if err != nil {
		s.log.Debug("zmtp: handshake", "type", s.typ, "remote", nc.RemoteAddr().String(), "err", err)
		nc.Close()
		return
	}
	p := &peer{conn: c, wake: make(chan struct{}, 1), gone: make(chan struct{})}
	s.mu.Lock()
	if s.mu.closed || (s.onJoin != nil && !s.onJoin(p)) {
		s.mu.Unlock()
		nc.Close()
		return
	}
	s.mu.peers[p] = struct{}{}
	s.mu.Unlock()
	go p.writeLoop()
	for {
		msg, err := c.ReadMsg()
		if err != nil {
			break
		}
		s.onMsg(p, msg)
	}
	// The reader is done: the peer left, or Close closed the connection.
	s.mu.Lock()
	delete(s.mu.peers, p)
	if s.onLeave != nil {
		s.onLeave(p)
	}
	s.mu.Unlock()
	p.mu.Lock()
	p.mu.closing = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	nc.Close()
	<-p.gone
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
	err := s.ln.Close()
	deadline := time.Now().Add(linger)
	for _, p := range peers {
		p.mu.Lock()
		p.mu.closing = true
		p.mu.Unlock()
		select {
		case p.wake <- struct{}{}:
		default:
		}
		p.conn.nc.SetWriteDeadline(deadline)
	}
	for _, p := range peers {
		select {
		case <-p.gone:
		case <-time.After(time.Until(deadline)):
		}
		p.conn.Close()
	}
	close(s.done)
	s.wg.Wait()
	return err
}

// Pub is a PUB socket: it sends each message to every peer subscribed to a
// prefix of its first frame, dropping it for a peer whose queue holds hwm
// messages (as libzmq does). Safe for concurrent use.
type Pub struct{ s server }

// ListenPub binds a PUB socket to endpoint (tcp://host:port; host * for all
// interfaces, port 0 for one the system picks). hwm > 0 bounds each peer's
// queue. log may not be nil.
func ListenPub(ctx context.Context, endpoint string, hwm int, log *slog.Logger) (*Pub, error) {
	p := &Pub{s: server{typ: "PUB", hwm: hwm, log: log}}
	p.s.onMsg = func(pr *peer, msg [][]byte) {
		// A subscription is one frame: 0x01 or 0x00, then the prefix.
		if len(msg) != 1 || len(msg[0]) == 0 || msg[0][0] > 1 {
			return
		}
		topic := string(msg[0][1:])
		pr.mu.Lock()
		if pr.mu.subs == nil {
			pr.mu.subs = map[string]int{}
		}
		if msg[0][0] == 1 {
			pr.mu.subs[topic]++
		} else if pr.mu.subs[topic] > 1 {
			pr.mu.subs[topic]--
		} else {
			delete(pr.mu.subs, topic)
		}
		pr.mu.Unlock()
	}
	if err := p.s.listen(ctx, endpoint); err != nil {
		return nil, err
	}
	return p, nil
}

// Endpoint returns the bound address as tcp://host:port.
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
		if pr.subscribed(msg[0]) && !pr.enqueue(msg, p.s.hwm) {
			p.s.drops.Add(1)
		}
	}
	return nil
}

func (p *peer) subscribed(topic []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for prefix := range p.mu.subs {
		if len(topic) >= len(prefix) && string(topic[:len(prefix)]) == prefix {
			return true
		}
	}
	return false
}

// Subscribers returns the number of peers subscribed to a prefix of topic.
func (p *Pub) Subscribers(topic []byte) int {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	n := 0
	for pr := range p.s.mu.peers {
		if pr.subscribed(topic) {
			n++
		}
	}
	return n
}

// Drops returns how many times a message was dropped for a peer whose
// queue was full.
func (p *Pub) Drops() uint64 { return p.s.drops.Load() }

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
// from peers wait in a queue of up to hwm messages for Recv; a peer's
// reader waits while it is full.
func ListenRouter(ctx context.Context, endpoint string, hwm int, log *slog.Logger) (*Router, error) {
	r := &Router{s: server{typ: "ROUTER", hwm: hwm, log: log}, in: make(chan [][]byte, 64), ids: map[string]*peer{}}
	r.s.onJoin = func(p *peer) bool {
		id := string(p.conn.Identity)
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
	r.s.onMsg = func(p *peer, msg [][]byte) {
		select {
		case r.in <- append([][]byte{[]byte(p.id)}, msg...):
		case <-r.s.done:
		}
	}
	if err := r.s.listen(ctx, endpoint); err != nil {
		return nil, err
	}
	return r, nil
}

// Endpoint returns the bound address as tcp://host:port.
func (r *Router) Endpoint() string { return r.s.Endpoint() }

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

// Close closes the socket as Pub.Close does.
func (r *Router) Close(linger time.Duration) error { return r.s.close(linger) }
