package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvconnect/kvconnect/connector/kvevents/internal/zmtp"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("kvevents: publisher closed")

// endSeq is the sequence frame that ends a replay: -1 as a signed 64-bit
// big-endian integer, as vLLM's END_SEQ.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Publisher publishes KV events on vLLM's wire: a PUB socket sends each
// batch as the multipart message [topic, seq, payload], and an optional
// ROUTER socket resends the latest batches on request. It is safe for
// concurrent use; it owns two goroutines (the sender and the replay
// server), which Close joins.
type Publisher struct {
	cfg    Config
	log    *slog.Logger
	topic  []byte
	pub    *zmtp.Pub
	replay *zmtp.Router // nil without a replay endpoint

	mu struct {
		sync.Mutex
		queue  [][]byte // encoded batches, oldest first
		events []int    // the number of events of each queued batch
		closed bool
	}
	wake      chan struct{} // capacity 1: the queue grew
	stop      chan struct{} // closed by Close
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup

	ring struct {
		sync.Mutex
		entries []entry // the latest BufferSteps batches, a ring
		next    int     // where the next entry goes
		full    bool
	}

	batches, events, droppedBatches, droppedEvents, replays, replayMalformed atomic.Uint64
	seq                                                                      uint64 // the sender's next sequence number
}

type entry struct {
	seq     uint64
	payload []byte
}

// Stats are a publisher's counters.
type Stats struct {
	Batches         uint64 // batches sent on the PUB socket (and buffered for replay)
	Events          uint64 // events in them
	DroppedBatches  uint64 // batches Publish dropped as the queue was full, or Close left unsent
	DroppedEvents   uint64 // events in them
	SubscriberDrops uint64 // messages dropped for a subscriber whose HWM was reached
	Replays         uint64 // replay requests answered
	ReplayMalformed uint64 // replay requests ignored: not [identity, "", start of up to 8 bytes]
	ReplayDrops     uint64 // replay replies dropped for a client with buffer_steps+1 replies unread
	Subscribers     int    // connected subscribers whose subscription matches the topic

	// Peers of the PUB and replay sockets (together) disconnected for
	// breaking a bound (see the package doc, "Security"), by bound.
	PeersRefused        uint64 // connections over Config.MaxPeers, closed at once
	PeersOversize       uint64 // a frame or message over its bound
	PeersOverSubscribed uint64 // subscriptions over their count or bytes
	PeersIdle           uint64 // silent past the idle bound, or half a message past its time
	PeersMalformed      uint64 // a handshake or message that broke ZMTP

	// A publisher that connects (Config.Mode): handshakes completed,
	// attempts that failed (each retried after a backoff), and batches
	// sent while it had no connection (queued for the next one within the
	// HWM, or counted in SubscriberDrops past it).
	Connects        uint64
	ConnectFailures uint64
	Disconnected    uint64
}

// Open validates cfg, binds or connects the PUB socket (see [Config.Mode]),
// binds the ROUTER socket of the replay endpoint, and starts the
// publisher's goroutines. ctx bounds the binding only. An endpoint that
// cannot be bound is an error; one that the publisher connects to is
// never an error here: the publisher retries in the background, counting
// the failures in [Stats].ConnectFailures, and Publish never waits for it.
func Open(ctx context.Context, cfg Config) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// A context that has ended opens nothing, whether the publisher would
	// bind (where ctx bounds the binding) or connect (where it is not
	// used after this).
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("kvevents: open %s: %w", cfg.Endpoint, err)
	}
	cfg = cfg.EnsureDefaults()
	p := &Publisher{
		cfg:   cfg,
		log:   cfg.Logger,
		topic: []byte(cfg.Topic),
		wake:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if cfg.Binds() {
		p.pub, err = zmtp.ListenPub(ctx, cfg.Endpoint, cfg.HWM, pubLimits(cfg), p.log)
	} else {
		p.pub, err = zmtp.DialPub(cfg.Endpoint, cfg.HWM, pubLimits(cfg), p.log)
	}
	if err != nil {
		return nil, fmt.Errorf("kvevents: endpoint: %w", err)
	}
	if cfg.ReplayEndpoint != "" {
		// A replay of the whole buffer fits a client's queue, and a client
		// that asks again without reading gets what fits (counted).
		p.replay, err = zmtp.ListenRouter(ctx, cfg.ReplayEndpoint, cfg.BufferSteps+1, replayLimits(cfg), p.log)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("kvevents: replay_endpoint: %w", err), p.pub.Close(0))
		}
	}
	p.ring.entries = make([]entry, 0, min(cfg.BufferSteps, 1024))
	p.wg.Add(1)
	go p.sendLoop()
	if p.replay != nil {
		p.wg.Add(1)
		go p.replayLoop()
	}
	return p, nil
}

// Endpoint returns the PUB socket's address, tcp://host:port, with the
// port the system chose when the configured port was 0; for a publisher
// that connects, the endpoint it connects to.
func (p *Publisher) Endpoint() string { return p.pub.Endpoint() }

// ReplayEndpoint returns the ROUTER socket's address as Endpoint does, or
// "" without replay.
func (p *Publisher) ReplayEndpoint() string {
	if p.replay == nil {
		return ""
	}
	return p.replay.Endpoint()
}

// Publish encodes events as one batch (one message, vLLM's KVEventBatch of
// one engine step) and queues it for the sender. It never blocks on the
// network: when MaxQueueSize batches are queued, the batch is dropped and
// counted in Stats. It copies what it needs: the caller keeps events and
// their slices. An empty events publishes nothing. It returns an error
// naming the first invalid event and field (nothing is queued then), or
// ErrClosed after Close.
func (p *Publisher) Publish(events []Event) error {
	if len(events) == 0 {
		return nil
	}
	for i := range events {
		if err := events[i].validate(); err != nil {
			return fmt.Errorf("kvevents: events[%d].%w", i, err)
		}
	}
	payload, err := encodeBatch(time.Now(), events, &p.cfg)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	if len(p.mu.queue) >= p.cfg.MaxQueueSize {
		p.mu.Unlock()
		p.droppedBatches.Add(1)
		p.droppedEvents.Add(uint64(len(events)))
		return nil
	}
	p.mu.queue = append(p.mu.queue, payload)
	p.mu.events = append(p.mu.events, len(events))
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

// sendLoop sends queued batches in order, numbering them from 0, until
// Close; then it sends what is queued until CloseTimeout has passed.
func (p *Publisher) sendLoop() {
	defer p.wg.Done()
	var deadline time.Time
	for {
		p.mu.Lock()
		queue, counts := p.mu.queue, p.mu.events
		p.mu.queue, p.mu.events = nil, nil
		closed := p.mu.closed
		p.mu.Unlock()
		if len(queue) == 0 {
			if closed {
				return
			}
			select {
			case <-p.wake:
			case <-p.stop:
				deadline = time.Now().Add(p.cfg.CloseTimeout)
			}
			continue
		}
		for i, payload := range queue {
			if !deadline.IsZero() && time.Now().After(deadline) {
				for _, n := range counts[i:] {
					p.droppedBatches.Add(1)
					p.droppedEvents.Add(uint64(n))
				}
				p.log.Warn("kvevents: batches left unsent at close", "batches", len(queue)-i)
				return
			}
			p.send(payload, counts[i])
		}
	}
}

func (p *Publisher) send(payload []byte, events int) {
	seq := p.seq
	p.seq++
	// Buffer first: a batch a subscriber has seen is one it can replay.
	p.ring.Lock()
	e := entry{seq: seq, payload: payload}
	if len(p.ring.entries) < p.cfg.BufferSteps {
		p.ring.entries = append(p.ring.entries, e)
	} else {
		p.ring.entries[p.ring.next] = e
		p.ring.full = true
	}
	p.ring.next = (p.ring.next + 1) % p.cfg.BufferSteps
	p.ring.Unlock()
	p.batches.Add(1)
	p.events.Add(uint64(events))
	msg := [][]byte{p.topic, binary.BigEndian.AppendUint64(nil, seq), payload}
	if err := p.pub.Send(msg); err != nil {
		p.log.Warn("kvevents: send", "seq", seq, "err", err)
	}
}

// buffered returns the buffered batches with a sequence number of start
// or more, oldest first.
func (p *Publisher) buffered(start uint64) []entry {
	p.ring.Lock()
	defer p.ring.Unlock()
	var out []entry
	n := len(p.ring.entries)
	first := 0
	if p.ring.full {
		first = p.ring.next
	}
	for i := range n {
		e := p.ring.entries[(first+i)%n]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}

// replayLoop answers replay requests until Close: a request is
// [identity, "", start] (a DEALER sends ["", start]), start the first
// wanted sequence number, big-endian; the replies are
// [identity, "", topic, seq, payload] for each buffered batch from start
// on, then [identity, "", "", -1, ""], as vLLM since 0.26 sends them (with
// LegacyReplay, [identity, "", seq, payload] and [identity, "", -1, ""]).
// A start past the newest batch gets the end marker alone.
func (p *Publisher) replayLoop() {
	defer p.wg.Done()
	for {
		msg, err := p.replay.Recv(p.stop)
		if err != nil {
			return
		}
		if len(msg) != 3 || len(msg[1]) != 0 || len(msg[2]) > 8 {
			p.replayMalformed.Add(1)
			p.log.Warn("kvevents: malformed replay request", "frames", len(msg))
			continue
		}
		var start uint64
		for _, b := range msg[2] {
			start = start<<8 | uint64(b)
		}
		id := msg[0]
		for _, e := range p.buffered(start) {
			if _, err := p.replay.Send(p.replayFrames(id, p.topic, binary.BigEndian.AppendUint64(nil, e.seq), e.payload)); err != nil {
				return
			}
		}
		if _, err := p.replay.Send(p.replayFrames(id, nil, endSeq, nil)); err != nil {
			return
		}
		p.replays.Add(1)
	}
}

// replayFrames returns one reply to the client id: a batch, or the end
// marker (an empty topic, seq endSeq and an empty payload).
func (p *Publisher) replayFrames(id, topic, seq, payload []byte) [][]byte {
	if p.cfg.LegacyReplay {
		return [][]byte{id, {}, seq, payload}
	}
	return [][]byte{id, {}, topic, seq, payload}
}

func (p *Publisher) replayDrops() uint64 {
	if p.replay == nil {
		return 0
	}
	return p.replay.Drops()
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() Stats {
	st := Stats{
		Batches:         p.batches.Load(),
		Events:          p.events.Load(),
		DroppedBatches:  p.droppedBatches.Load(),
		DroppedEvents:   p.droppedEvents.Load(),
		SubscriberDrops: p.pub.Drops(),
		Replays:         p.replays.Load(),
		ReplayMalformed: p.replayMalformed.Load(),
		ReplayDrops:     p.replayDrops(),
		Subscribers:     p.pub.Subscribers(p.topic),
	}
	c := p.pub.Counters()
	if p.replay != nil {
		r := p.replay.Counters()
		c.Refused += r.Refused
		c.Oversize += r.Oversize
		c.Subscriptions += r.Subscriptions
		c.Idle += r.Idle
		c.Malformed += r.Malformed
	}
	st.PeersRefused, st.PeersOversize, st.PeersOverSubscribed, st.PeersIdle, st.PeersMalformed = c.Refused, c.Oversize, c.Subscriptions, c.Idle, c.Malformed
	st.Connects, st.ConnectFailures, st.Disconnected = c.Connects, c.DialFailures, c.Disconnected
	return st
}

// Close stops Publish, sends what is queued for up to CloseTimeout (what
// is left is counted as dropped), lets the sockets flush for up to
// CloseTimeout more, closes them and joins the publisher's goroutines. It
// is idempotent and returns the first error of closing the sockets.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.mu.closed = true
		p.mu.Unlock()
		close(p.stop)
		p.wg.Wait() // the sender has sent or dropped the queue
		err := p.pub.Close(p.cfg.CloseTimeout)
		if p.replay != nil {
			err = errors.Join(err, p.replay.Close(0))
		}
		p.closeErr = err
	})
	return p.closeErr
}
