package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"

	"github.com/kvconnect/kvconnect/store"
)

// The watch's timing: the server takes its feed's events every watchPoll,
// and sends a frame at least every watchKeepalive, empty if need be; a
// client that has had no frame for watchDead takes the connection for
// broken.
const (
	watchPoll      = 10 * time.Millisecond
	watchKeepalive = time.Second
	watchDead      = 10 * watchKeepalive
)

// Bounds of an events frame: the events it carries, and a medium's length.
const (
	eventsPerFrame = 256
	maxMedium      = 256
	maxEventsBody  = 8 + 4 + eventsPerFrame*(2+store.MaxKeyLen+1+2+maxMedium)
)

// watch serves a watch request: it starts a feed of the served store, and
// sends its events to the client until the connection ends.
func (c *sconn) watch(h header) error {
	d := dec{b: c.body}
	n := int(d.u32())
	if err := d.end(); err != nil {
		return err
	}
	var err error
	switch {
	case c.srv.watcher == nil:
		err = errors.New("remote: watch: the served store is no store.Watcher")
	case n < 1 || n > store.MaxWatch:
		err = fmt.Errorf("remote: watch: buffer of %d events is outside [1, %d]", n, store.MaxWatch)
	}
	var f *store.Feed
	if err == nil {
		f, err = c.srv.watcher.Watch(min(n, c.srv.opts.MaxWatch))
	}
	c.out = callReply(c.out[:0], err, 0, nil)
	if rerr := c.reply(msgReply, h.id, nil); rerr != nil || err != nil {
		if f != nil {
			f.Close()
		}
		return rerr // a refused watch leaves the connection as it was
	}
	defer f.Close()
	c.freeStage() // a watching connection stages nothing
	tick := time.NewTicker(watchPoll)
	defer tick.Stop()
	var evs []store.KeyEvent
	last := time.Now()
	for {
		select {
		case fr := <-c.next:
			if fr.err != nil {
				return fr.err
			}
			return fmt.Errorf("%w: frame of type %d on a watching connection", errFrame, fr.h.typ)
		case <-c.srv.base.Done():
			return net.ErrClosed
		case <-tick.C:
		}
		var lost int64
		evs, lost = f.Take(evs[:0])
		if len(evs) == 0 && lost == 0 && time.Since(last) < watchKeepalive {
			continue
		}
		if err := c.sendEvents(h.id, evs, lost); err != nil {
			return err
		}
		last = time.Now()
	}
}

// sendEvents sends evs, then the count of events lost after them, in
// frames of eventsPerFrame events at most. An event the wire cannot
// carry (a key longer than store.MaxKeyLen, a medium longer than
// maxMedium) is counted lost, and so are the events after it.
func (c *sconn) sendEvents(id uint32, evs []store.KeyEvent, lost int64) error {
	for i, e := range evs {
		if len(e.Key) > store.MaxKeyLen || len(e.Medium) > maxMedium || e.Op < store.KeyStored || e.Op > store.KeyExpired {
			lost += int64(len(evs) - i)
			evs = evs[:i]
			break
		}
	}
	for {
		k := min(len(evs), eventsPerFrame)
		var l int64
		if k == len(evs) {
			l = lost
		}
		b := enc(c.out[:0]).u64(uint64(l)).u32(uint32(k))
		for _, e := range evs[:k] {
			b = b.str(e.Key).u8(byte(e.Op)).str(e.Medium)
		}
		c.out = b
		if err := c.reply(msgEvents, id, nil); err != nil {
			return err
		}
		evs = evs[k:]
		if len(evs) == 0 {
			return nil
		}
	}
}

// cwatch is one watch of a client: its feeds (of one feed, the reader's),
// and the connection that fills them.
type cwatch struct {
	c     *client
	n     int
	feeds store.Feeds

	mu struct {
		sync.Mutex
		nc      net.Conn // nil while it redials
		stopped bool
	}
}

// watch implements store.Watcher.Watch for the client of a store.Watcher:
// it opens a connection of its own to the server, asks for a watch of n
// events there, and fills the feed it returns from what comes.
func (c *client) watch(n int) (*store.Feed, error) {
	if err := c.enter(); err != nil {
		return nil, fmt.Errorf("remote: watch: %w", err)
	}
	defer c.exit()
	w := &cwatch{c: c, n: n}
	f, err := w.feeds.Watch(n)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.closing, c.opts.CallTimeout)
	defer cancel()
	cc, id, err := w.open(ctx)
	if err != nil {
		w.feeds.Close()
		return nil, err
	}
	w.mu.nc = cc.nc
	c.watches.Lock()
	c.watches.set[w] = struct{}{}
	c.watches.Unlock()
	c.watches.wg.Go(func() { w.run(cc, id) })
	return f, nil
}

// open dials the server and starts a watch there.
func (w *cwatch) open(ctx context.Context) (*cconn, uint32, error) {
	cc, lim, err := w.c.dial(ctx)
	if err != nil {
		return nil, 0, err
	}
	if lim != w.c.limits {
		_ = cc.nc.Close() // refused: the server is not the one dialed
		return nil, 0, fmt.Errorf("%w: remote: watch: the server at %s %s now has limits %+v, not %+v", store.ErrUnavailable, w.c.network, w.c.address, lim, w.c.limits)
	}
	stop := context.AfterFunc(ctx, func() { _ = cc.nc.SetDeadline(time.Unix(1, 0)) })
	id := w.c.nextID()
	if d, ok := ctx.Deadline(); ok {
		err = cc.nc.SetDeadline(d)
	}
	var h header
	if err == nil {
		h, err = cc.exchange(msgWatch, id, enc(nil).u32(uint32(w.n)))
	}
	if err == nil && h.typ != msgReply {
		err = fmt.Errorf("%w: reply of type %d to a watch", errFrame, h.typ)
	}
	if err == nil {
		err = replyError(cc.body)
	}
	if !stop() {
		err = ctx.Err()
	}
	if err != nil {
		_ = cc.nc.Close() // the watch's error says why
		if ctx.Err() != nil {
			return nil, 0, fmt.Errorf("remote: watch: %w", ctx.Err())
		}
		if isTimeout(err) {
			return nil, 0, fmt.Errorf("%w: remote: watch: no answer within the call timeout: %w", store.ErrUnavailable, err)
		}
		return nil, 0, fmt.Errorf("remote: watch: %w", err)
	}
	cc.maxReply = maxEventsBody
	return cc, id, nil
}

// run fills the feed from cc until the reader closes the feed or the
// client is closed. A connection that breaks counts an event lost (how
// many were, nobody knows: the reader must resynchronise), and is made
// again, after a pause that doubles while dials fail.
func (w *cwatch) run(cc *cconn, id uint32) {
	defer w.c.forget(w)
	defer w.feeds.Close()
	delay := watchRetry
	for {
		if cc != nil {
			w.receive(cc, id)
			_ = cc.nc.Close() // ended: receive says why in the feed's lost count
			w.feeds.Lose(1)
			delay = watchRetry
		}
		w.mu.Lock()
		w.mu.nc = nil
		stopped := w.mu.stopped
		w.mu.Unlock()
		if stopped || !w.feeds.Watching() {
			return
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-w.c.closing.Done():
			t.Stop()
			return
		}
		delay = min(2*delay, maxWatchRetry)
		ctx, cancel := context.WithTimeout(w.c.closing, w.c.opts.CallTimeout)
		var err error
		cc, id, err = w.open(ctx)
		cancel()
		if err != nil {
			cc = nil
			continue
		}
		w.mu.Lock()
		if w.mu.stopped {
			w.mu.Unlock()
			_ = cc.nc.Close() // the client is closing
			return
		}
		w.mu.nc = cc.nc
		w.mu.Unlock()
	}
}

// The pause before a watch dials again: the first, doubled after each
// failed dial up to the last.
const (
	watchRetry    = 100 * time.Millisecond
	maxWatchRetry = 5 * time.Second
)

// receive announces the events of cc's frames until the connection fails,
// a frame is bad, or the reader closed its feed.
func (w *cwatch) receive(cc *cconn, id uint32) {
	for w.feeds.Watching() {
		if err := cc.nc.SetReadDeadline(time.Now().Add(watchDead)); err != nil {
			return
		}
		if _, err := io.ReadFull(cc.nc, cc.hdr[:]); err != nil {
			return
		}
		h, err := parseHeader(cc.hdr[:], cc.maxReply)
		if err != nil || h.typ != msgEvents || h.id != id || h.data != 0 {
			return
		}
		crc := crc32Of(cc.hdr[:])
		if cc.readBody(h, &crc) != nil || readTrailer(cc.nc, crc) != nil {
			return
		}
		evs, lost, err := parseEvents(cc.body)
		if err != nil {
			return
		}
		for _, e := range evs {
			w.feeds.Announce(e)
		}
		w.feeds.Lose(lost)
	}
}

// parseEvents decodes the body of an events frame, refusing one that the
// server's bounds would not produce.
func parseEvents(body []byte) ([]store.KeyEvent, int64, error) {
	d := dec{b: body}
	lost := d.u64()
	n := d.u32()
	if d.err == nil && (n > eventsPerFrame || lost > math.MaxInt64) {
		return nil, 0, fmt.Errorf("%w: events frame of %d events, %d lost", errFrame, n, lost)
	}
	evs := make([]store.KeyEvent, 0, min(n, eventsPerFrame))
	for range n {
		e := store.KeyEvent{Key: d.str(), Op: store.KeyOp(d.u8()), Medium: d.str()}
		if d.err != nil {
			break
		}
		if e.Op < store.KeyStored || e.Op > store.KeyExpired || len(e.Key) > store.MaxKeyLen || len(e.Medium) > maxMedium {
			return nil, 0, fmt.Errorf("%w: event %v of key %.64q, medium of %d bytes", errFrame, e.Op, e.Key, len(e.Medium))
		}
		evs = append(evs, e)
	}
	if err := d.end(); err != nil {
		return nil, 0, err
	}
	return evs, int64(lost), nil
}

// stop ends w's connection, and its goroutine soon after.
func (w *cwatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mu.stopped = true
	if w.mu.nc != nil {
		_ = w.mu.nc.Close() // ends receive
	}
}

// forget drops w from the client's watches.
func (c *client) forget(w *cwatch) {
	c.watches.Lock()
	delete(c.watches.set, w)
	c.watches.Unlock()
}

// stopWatches stops every watch of c and waits for their goroutines.
func (c *client) stopWatches() {
	c.watches.Lock()
	ws := make([]*cwatch, 0, len(c.watches.set))
	for w := range c.watches.set {
		ws = append(ws, w)
	}
	c.watches.Unlock()
	for _, w := range ws {
		w.stop()
	}
	c.watches.wg.Wait()
}
