package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"testing"
	"time"
)

// waitTimeout bounds every wait of these tests: generous, as a loaded
// machine may be slow, and each wait names what it waited for.
const waitTimeout = 2 * time.Minute

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitTimeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// rawPeer connects to endpoint and completes the handshake as typ; the
// test writes raw bytes to it.
func rawPeer(t *testing.T, endpoint, typ string) *Conn {
	t.Helper()
	c, err := Dial(context.Background(), endpoint, typ, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// frameHeader returns the header of a long frame of n bytes.
func frameHeader(more bool, n int) []byte {
	flags := byte(flagLong)
	if more {
		flags |= flagMore
	}
	return binary.BigEndian.AppendUint64([]byte{flags}, uint64(n))
}

// sendUnfinished writes frames of chunk bytes, each with MORE set, until
// total bytes are sent or the socket drops the connection; it returns the
// bytes written and the write error (nil when all were written).
func sendUnfinished(c *Conn, total, chunk int) (int, error) {
	body := make([]byte, chunk)
	sent := 0
	c.nc.SetWriteDeadline(time.Now().Add(waitTimeout))
	for sent < total {
		if _, err := c.nc.Write(frameHeader(true, chunk)); err != nil {
			return sent, err
		}
		n, err := c.nc.Write(body)
		sent += n
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}

// heapAfterGC returns the live heap after a collection.
func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func totalAlloc() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// closedByPeer waits until c reads EOF or a reset: the socket dropped it.
func closedByPeer(t *testing.T, c *Conn, what string) {
	t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(waitTimeout))
	_, err := io.Copy(io.Discard, c.nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the socket did not drop the peer within %v", what, waitTimeout)
	}
}

// TestUnfinishedMessage: a peer that sends 128 MiB of one multipart message
// and never ends it. A PUB reads it frame by frame and discards it, holding
// nothing of it, even with message bounds wide enough to let it through;
// with the bounds the publisher uses, a PUB and a ROUTER drop the peer at
// the bound and count it, holding at most the bound.
func TestUnfinishedMessage(t *testing.T) {
	const total, chunk = 128 << 20, 64 << 10
	log := slog.New(slog.DiscardHandler)

	t.Run("PUB discards within wide bounds", func(t *testing.T) {
		wide := testLimits
		wide.Msg = Limits{Frame: 1 << 20, Bytes: 1 << 30, Frames: 1 << 20}
		wide.Idle = 0 // 128 MiB take what they take: no idle bound armed before the message ends
		pub, err := ListenPub(context.Background(), "tcp://127.0.0.1:0", 10, wide, log)
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close(0)
		c := rawPeer(t, pub.Endpoint(), "SUB")
		before := heapAfterGC()
		allocBefore := totalAlloc()
		if n, err := sendUnfinished(c, total, chunk); err != nil {
			t.Fatalf("after %d bytes: %v; want the PUB to read and discard them", n, err)
		}
		// End the message, then subscribe: the PUB counts the subscription
		// once it has read every byte before it.
		if _, err := c.nc.Write(append(frameHeader(false, 0), 0x00, 0x02, 0x01, 't')); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the subscription after the 128 MiB message", func() bool { return pub.Subscribers([]byte("t")) == 1 })
		allocated := totalAlloc() - allocBefore
		grown := int64(heapAfterGC()) - int64(before)
		t.Logf("128 MiB unfinished then ended: %d bytes allocated, heap grown by %d", allocated, grown)
		if allocated > 4<<20 {
			t.Errorf("the PUB allocated %d bytes reading a 128 MiB message it discards, want under 4 MiB", allocated)
		}
	})

	for _, typ := range []string{"PUB", "ROUTER"} {
		t.Run(typ+" drops at the bound", func(t *testing.T) {
			lim := testLimits
			lim.Msg = Limits{Frame: 1 << 20, Bytes: 4 << 20, Frames: 1 << 20}
			var endpoint string
			var counters func() Counters
			if typ == "PUB" {
				pub, err := ListenPub(context.Background(), "tcp://127.0.0.1:0", 10, lim, log)
				if err != nil {
					t.Fatal(err)
				}
				defer pub.Close(0)
				endpoint, counters = pub.Endpoint(), pub.Counters
			} else {
				r, err := ListenRouter(context.Background(), "tcp://127.0.0.1:0", 10, lim, log)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close(0)
				endpoint, counters = r.Endpoint(), r.Counters
			}
			peerType := map[string]string{"PUB": "SUB", "ROUTER": "DEALER"}[typ]
			c := rawPeer(t, endpoint, peerType)
			before := heapAfterGC()
			n, err := sendUnfinished(c, total, chunk)
			grown := int64(heapAfterGC()) - int64(before)
			t.Logf("%s: %d of %d bytes sent (%v), heap grown by %d", typ, n, total, err, grown)
			if err == nil {
				closedByPeer(t, c, typ)
			}
			waitFor(t, "the oversize peer to be counted", func() bool { return counters().Oversize == 1 })
			if grown > 16<<20 {
				t.Errorf("%s: heap grew by %d bytes for an unfinished message, want at most the 4 MiB bound and buffers", typ, grown)
			}
		})
	}
}

// TestSubscriptionFlood: a peer that subscribes to 100,000 prefixes is
// dropped at the bound and counted, and so is one whose prefixes are over
// the byte bound; a peer within the bounds keeps receiving.
func TestSubscriptionFlood(t *testing.T) {
	pub, err := ListenPub(context.Background(), "tcp://127.0.0.1:0", 10, testLimits, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(0)
	good := rawPeer(t, pub.Endpoint(), "SUB")
	if err := good.WriteMsg([][]byte{{1, 't'}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the good subscription", func() bool { return pub.Subscribers([]byte("t")) == 1 })

	flood := rawPeer(t, pub.Endpoint(), "SUB")
	before := heapAfterGC()
	var w bytes.Buffer
	for i := range 100000 {
		w.Reset()
		fmt.Fprintf(&w, "\x01prefix-%06d", i)
		if err := flood.writeMsg([][]byte{w.Bytes()}); err != nil {
			break // dropped
		}
	}
	flood.bw.Flush()
	closedByPeer(t, flood, "the flood")
	waitFor(t, "the flood to be counted", func() bool { return pub.Counters().Subscriptions == 1 })
	if grown := int64(heapAfterGC()) - int64(before); grown > 4<<20 {
		t.Errorf("heap grew by %d bytes for a subscription flood, want it bounded by %d subscriptions", grown, testLimits.Subs)
	}

	long := rawPeer(t, pub.Endpoint(), "SUB")
	if err := long.WriteMsg([][]byte{append([]byte{1}, bytes.Repeat([]byte{'x'}, testLimits.SubBytes+1)...)}); err != nil {
		t.Fatal(err)
	}
	closedByPeer(t, long, "the long subscription")
	waitFor(t, "the long subscription to be counted", func() bool { return pub.Counters().Subscriptions == 2 })

	if err := pub.Send([][]byte{[]byte("t"), []byte("still")}); err != nil {
		t.Fatal(err)
	}
	good.SetDeadline(time.Now().Add(waitTimeout))
	if m, err := good.ReadMsg(); err != nil || string(m[1]) != "still" {
		t.Errorf("the good subscriber read %q, %v", m, err)
	}
}

// TestPeerBound: 600 connections to a socket bounded to 16 peers: the rest
// are closed at once and counted, and the goroutines stay bounded by the
// peers, not the connections. The peers may stay idle (Idle 0): on a
// loaded machine the 600 dials can outlast any idle bound, and a peer
// dropped for idling would free a place for one of them.
func TestPeerBound(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	lim := testLimits
	lim.Idle = 0
	for _, typ := range []string{"PUB", "ROUTER"} {
		t.Run(typ, func(t *testing.T) {
			base := runtime.NumGoroutine()
			var endpoint string
			var counters func() Counters
			var closeSock func(time.Duration) error
			if typ == "PUB" {
				pub, err := ListenPub(context.Background(), "tcp://127.0.0.1:0", 10, lim, log)
				if err != nil {
					t.Fatal(err)
				}
				endpoint, counters, closeSock = pub.Endpoint(), pub.Counters, pub.Close
			} else {
				r, err := ListenRouter(context.Background(), "tcp://127.0.0.1:0", 10, lim, log)
				if err != nil {
					t.Fatal(err)
				}
				endpoint, counters, closeSock = r.Endpoint(), r.Counters, r.Close
			}
			addr, _ := TCPAddr(endpoint)
			// The peers the bound allows, handshakes done...
			for range testLimits.Peers {
				rawPeer(t, endpoint, map[string]string{"PUB": "SUB", "ROUTER": "DEALER"}[typ])
			}
			// ...then 600 more connections.
			const conns = 600
			var ncs []net.Conn
			defer func() {
				for _, nc := range ncs {
					nc.Close()
				}
			}()
			for range conns {
				nc, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatalf("dial %d: %v", len(ncs), err)
				}
				ncs = append(ncs, nc)
			}
			waitFor(t, "the connections over the bound to be refused", func() bool {
				return counters().Refused == conns
			})
			// Each peer in its handshake holds one goroutine; the socket
			// holds an accept loop.
			if n := runtime.NumGoroutine() - base; n > 2*testLimits.Peers+4 {
				t.Errorf("%d goroutines for %d connections, want at most %d", n, conns, 2*testLimits.Peers+4)
			}
			if err := closeSock(0); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the socket's goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
		})
	}
}

// TestIdlePeers: a PUB drops a peer that does not subscribe within Idle
// and one that stalls in the middle of a message for MsgTimeout, and
// counts them; a subscribed peer may stay silent. A ROUTER drops a peer
// that sends no request within Idle.
func TestIdlePeers(t *testing.T) {
	lim := testLimits
	lim.Idle = 200 * time.Millisecond
	lim.Msg.MsgTimeout = 200 * time.Millisecond
	log := slog.New(slog.DiscardHandler)
	pub, err := ListenPub(context.Background(), "tcp://127.0.0.1:0", 10, lim, log)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(0)
	// A peer that subscribes at once. On a machine slow enough that
	// the socket dropped it for idling before its subscription came, a
	// new one tries again.
	var subscribed *Conn
	for deadline := time.Now().Add(waitTimeout); subscribed == nil; {
		idle := pub.Counters().Idle
		p := rawPeer(t, pub.Endpoint(), "SUB")
		if err := p.WriteMsg([][]byte{{1}}); err == nil {
			waitFor(t, "the subscription, or the peer dropped for idling", func() bool {
				return pub.Subscribers(nil) == 1 || pub.Counters().Idle > idle
			})
			if pub.Subscribers(nil) == 1 {
				subscribed = p
				break
			}
		}
		p.Close()
		if time.Now().After(deadline) {
			t.Fatalf("no peer's subscription reached the socket within its idle bound in %v", waitTimeout)
		}
	}
	idle := pub.Counters().Idle // peers dropped while subscribing

	silent := rawPeer(t, pub.Endpoint(), "SUB")
	closedByPeer(t, silent, "a peer that never subscribes")
	waitFor(t, "the silent peer to be counted", func() bool { return pub.Counters().Idle == idle+1 })

	// The subscribed peer has been silent for longer than Idle by now.
	if n := pub.Subscribers(nil); n != 1 {
		t.Errorf("Subscribers = %d after the idle bound, want the silent subscriber kept", n)
	}
	if err := subscribed.WriteMsg([][]byte{{1}}); err != nil { // a second count of the same prefix
		t.Fatal(err)
	}
	if _, err := subscribed.nc.Write(frameHeader(true, 100)); err != nil { // then half a message
		t.Fatal(err)
	}
	closedByPeer(t, subscribed, "a subscriber stalled in a message")
	waitFor(t, "the stalled subscriber to be counted", func() bool { return pub.Counters().Idle == idle+2 })

	// A ROUTER: a client that asked for 16 MiB of replies and reads none
	// yet is busy, not idle; one that sends nothing is dropped.
	r, err := ListenRouter(context.Background(), "tcp://127.0.0.1:0", 100, lim, log)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(0)
	// A client that asks at once (again with a new one, where the socket
	// dropped it for idling before its request came).
	var slow *Conn
	var req [][]byte
	for deadline := time.Now().Add(waitTimeout); slow == nil; {
		idle := r.Counters().Idle
		p := rawPeer(t, r.Endpoint(), "DEALER")
		p.Limits.Frame, p.Limits.Bytes = 1<<20, 1<<20
		if err := p.WriteMsg([][]byte{{}, []byte("replay")}); err != nil {
			p.Close()
			if time.Now().After(deadline) {
				t.Fatalf("no client could send its request in %v: %v", waitTimeout, err)
			}
			continue
		}
		type recv struct {
			m   [][]byte
			err error
		}
		cancel, got := make(chan struct{}), make(chan recv, 1)
		go func() {
			m, err := r.Recv(cancel)
			got <- recv{m, err}
		}()
		var g recv
		received := false
		waitFor(t, "the request, or the client dropped for idling", func() bool {
			select {
			case g = <-got:
				received = true
				return true
			default:
				return r.Counters().Idle > idle
			}
		})
		if !received {
			close(cancel)
			g = <-got
		}
		if g.err == nil {
			slow, req = p, g.m
			break
		}
		p.Close()
		if time.Now().After(deadline) {
			t.Fatalf("no client's request reached the socket within its idle bound in %v", waitTimeout)
		}
	}
	reply := make([]byte, 256<<10)
	for range 64 {
		if ok, err := r.Send([][]byte{req[0], {}, reply}); !ok || err != nil {
			t.Fatalf("Send = %v, %v", ok, err)
		}
	}
	closedByPeer(t, rawPeer(t, r.Endpoint(), "DEALER"), "a ROUTER peer that sends nothing")
	waitFor(t, "the silent ROUTER peer to be counted", func() bool { return r.Counters().Idle >= 1 })
	// The slow client has been silent for longer than Idle by now.
	slow.SetDeadline(time.Now().Add(waitTimeout))
	for i := range 64 {
		if m, err := slow.ReadMsg(); err != nil || len(m) != 2 || len(m[1]) != len(reply) {
			t.Fatalf("the slow client's reply %d: %d frames, %v; want it served whole", i, len(m), err)
		}
	}
	// (Once served, the slow client is idle in its turn, and dropped
	// after Idle: no count is checked past this point.)
}

// TestHandshakeBounds: a silent connection ends at the handshake's time
// bound and a peer whose READY is over its bound, or whose greeting is not
// ZMTP, is dropped; each is counted.
func TestHandshakeBounds(t *testing.T) {
	pub, err := ListenPub(context.Background(), "tcp://127.0.0.1:0", 10, testLimits, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(0)
	addr, _ := TCPAddr(pub.Endpoint())
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write(bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 8))
	nc.SetReadDeadline(time.Now().Add(waitTimeout))
	io.Copy(io.Discard, nc)
	waitFor(t, "the non-ZMTP peer to be counted", func() bool { return pub.Counters().Malformed == 1 })

	// A READY of 1 MiB: over the 8 KiB that a handshake reads.
	nc2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	var g [greetingLen]byte
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	nc2.Write(g[:])
	nc2.Write(append(binary.BigEndian.AppendUint64([]byte{flagCommand | flagLong}, 1<<20), 5, 'R', 'E', 'A', 'D', 'Y'))
	nc2.SetReadDeadline(time.Now().Add(waitTimeout))
	io.Copy(io.Discard, nc2)
	waitFor(t, "the huge READY to be counted", func() bool { return pub.Counters().Oversize == 1 })
}

// TestDialPub: a connecting PUB retries an endpoint nobody listens on
// (counted), connects when a SUB binds it, delivers to it, keeps what is
// sent while the SUB is away within its HWM and delivers it on the next
// connection, and drops (and counts) a SUB that sends garbage, then
// connects again.
func TestDialPub(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens: the PUB retries
	pub, err := DialPub("tcp://"+addr, 4, testLimits, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(0)
	waitFor(t, "a counted failed attempt", func() bool { return pub.Counters().DialFailures >= 1 })
	if err := pub.Send([][]byte{[]byte("t"), []byte("nobody")}); err != nil {
		t.Fatal(err)
	}

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken in between: %v", err)
	}
	defer ln.Close()
	accept := func() *Conn {
		t.Helper()
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(waitTimeout))
		nc, err := ln.Accept()
		if err != nil {
			t.Fatalf("waiting for the PUB to connect: %v", err)
		}
		c, err := Handshake(nc, "SUB", nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Limits.Frame = 1 << 20
		t.Cleanup(func() { c.Close() })
		return c
	}
	read := func(c *Conn) string {
		t.Helper()
		c.SetDeadline(time.Now().Add(waitTimeout))
		m, err := c.ReadMsg()
		if err != nil {
			t.Fatal(err)
		}
		return string(m[1])
	}
	sub := accept()
	if err := sub.WriteMsg([][]byte{{1, 't'}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscription of the bound SUB", func() bool { return pub.Subscribers([]byte("t")) == 1 })
	pub.Send([][]byte{[]byte("t"), []byte("one")})
	if got := read(sub); got != "one" {
		t.Fatalf("the SUB read %q, want one (nothing sent before the connection)", got)
	}

	sub.Close()
	waitFor(t, "the PUB to see the SUB leave", func() bool { return pub.Subscribers([]byte("t")) == 0 })
	for i := range 6 { // HWM 4: two dropped
		pub.Send([][]byte{[]byte("t"), fmt.Appendf(nil, "away-%d", i)})
	}
	if c := pub.Counters(); c.Disconnected < 6 || pub.Drops() != 2 {
		t.Errorf("Counters = %+v, Drops = %d; want 6 sends while disconnected, 2 over the HWM", c, pub.Drops())
	}
	sub = accept()
	for i := range 4 {
		if got, want := read(sub), fmt.Sprintf("away-%d", i); got != want {
			t.Errorf("after reconnecting, the SUB read %q, want %q", got, want)
		}
	}

	// Garbage: a frame of 1 GiB announced.
	if _, err := sub.nc.Write(frameHeader(false, 1<<30)); err != nil {
		t.Fatal(err)
	}
	closedByPeer(t, sub, "a SUB that sends garbage")
	waitFor(t, "the garbage SUB to be counted", func() bool { return pub.Counters().Oversize == 1 })
	sub = accept()
	if err := sub.WriteMsg([][]byte{{1, 't'}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscription after the garbage", func() bool { return pub.Subscribers([]byte("t")) == 1 })
	if c := pub.Counters(); c.Connects != 3 {
		t.Errorf("Counters().Connects = %d, want 3", c.Connects)
	}
}

// FuzzReadMsgMemory: reading any bytes, as a client (ReadMsg) or as a PUB
// (subscriptions kept, the rest discarded), allocates in proportion to the
// bytes read, not to the sizes the bytes announce.
func FuzzReadMsgMemory(f *testing.F) {
	f.Add([]byte{0x00, 0x01, 'a'})
	f.Add([]byte{0x01, 0x00, 0x00, 0x02, 'h', 'i'})
	f.Add([]byte{0x04, 0x0a, 0x09, 'S', 'U', 'B', 'S', 'C', 'R', 'I', 'B', 'E'})
	f.Add([]byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff})
	f.Add([]byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 'x'})
	f.Add([]byte{0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 1, 2, 3})
	f.Add(append([]byte{0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x09}, "SUBSCRIBE"...))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, keep := range []int{-1, 64} {
			c := &Conn{br: bufio.NewReaderSize(bytes.NewReader(data), 16), bw: bufio.NewWriter(io.Discard), Limits: Limits{Frame: 1 << 20, Bytes: 1 << 21, Frames: 64}}
			before := totalAlloc()
			for range 8 {
				if _, err := c.readMsg(keep); err != nil {
					break
				}
			}
			// Bodies grow as bytes arrive (at most twice what came, from a
			// first chunk of 4 KiB), plus the frames' slice headers.
			if got, bound := totalAlloc()-before, uint64(3*len(data)+64<<10); got > bound {
				t.Fatalf("readMsg(keep %d) of %d bytes allocated %d bytes, over %d", keep, len(data), got, bound)
			}
		}
	})
}

// BenchmarkPubSendSubscriptions: the cost of Send does not grow with a
// peer's subscriptions. Two PUB sockets, each with one peer, that peer
// subscribed to 1 prefix on one and to 4,096 of 4 to 23 bytes on the
// other (none matching, so only the matching is measured); topics alternate so that the last
// answer is never reused. Reports each socket's time per Send and their
// ratio (many/one), measured in the same loop.
func BenchmarkPubSendSubscriptions(b *testing.B) {
	const many = 4096
	lim := testLimits
	lim.Subs, lim.SubBytes = many+1, many*16
	log := slog.New(slog.DiscardHandler)
	pubs := make([]*Pub, 2)
	for i, n := range []int{1, many} {
		pub, err := ListenPub(context.Background(), "tcp://127.0.0.1:0", 10, lim, log)
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close(0)
		c, err := Dial(context.Background(), pub.Endpoint(), "SUB", nil)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		for j := range n {
			// Prefixes of 4 to 23 bytes, none a prefix of the topics: every
			// length of the topics' prefixes has subscriptions to look up.
			s := fmt.Appendf(nil, "\x01%x", j)
			for len(s) < 1+4+j%20 {
				s = append(s, 'z')
			}
			c.writeMsg([][]byte{s})
		}
		c.writeMsg([][]byte{[]byte("\x01last")})
		if err := c.bw.Flush(); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(waitTimeout)
		for pub.Subscribers([]byte("last")) != 1 {
			if time.Now().After(deadline) {
				b.Fatal("the subscriptions were not counted")
			}
			time.Sleep(time.Millisecond)
		}
		pubs[i] = pub
	}
	topics := [][][]byte{{[]byte("kv@pod-0@model"), nil}, {[]byte("kv@pod-1@model"), nil}}
	var spent [2]time.Duration
	sends := 0
	for b.Loop() {
		for i, pub := range pubs {
			start := time.Now()
			for k := range 64 {
				pub.Send(topics[k%2])
			}
			spent[i] += time.Since(start)
		}
		sends += 64
	}
	one, lots := float64(spent[0].Nanoseconds())/float64(sends), float64(spent[1].Nanoseconds())/float64(sends)
	b.ReportMetric(one, "ns/send-1-sub")
	b.ReportMetric(lots, "ns/send-4096-subs")
	b.ReportMetric(lots/one, "ratio")
}

// fakeConn is a net.Conn that reads r and discards what is written.
type fakeConn struct{ r io.Reader }

func (f fakeConn) Read(b []byte) (int, error)       { return f.r.Read(b) }
func (f fakeConn) Write(b []byte) (int, error)      { return len(b), nil }
func (f fakeConn) Close() error                     { return nil }
func (f fakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (f fakeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (f fakeConn) SetDeadline(time.Time) error      { return nil }
func (f fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (f fakeConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzHandshakeMemory: a handshake with a peer that sends any bytes
// allocates in proportion to them, beyond the connection's two buffers:
// a READY that announces 1 GiB holds no more than what came of it.
func FuzzHandshakeMemory(f *testing.F) {
	var g [greetingLen]byte
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	ready := appendProperty(nil, "Socket-Type", []byte("SUB"))
	f.Add(append(append(g[:], flagCommand, byte(6+len(ready)), 5, 'R', 'E', 'A', 'D', 'Y'), ready...))
	f.Add(append(g[:], flagCommand|flagLong, 0, 0, 0, 0x40, 0, 0, 0, 0, 5, 'R', 'E', 'A', 'D', 'Y'))
	f.Add(append(g[:], flagCommand|flagLong, 0, 0, 0, 0, 0, 0, 0x1f, 0xff, 5, 'R', 'E', 'A', 'D', 'Y'))
	f.Add(append(g[:], flagCommand|flagLong, 0, 0, 0, 0, 0, 0x10, 0, 0, 5, 'R', 'E', 'A', 'D', 'Y'))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		before := totalAlloc()
		c, err := Handshake(fakeConn{bytes.NewReader(data)}, "PUB", nil)
		if err == nil {
			c.Limits = Limits{Frame: 1 << 20, Bytes: 1 << 21, Frames: 64}
			for range 4 {
				if _, err := c.readMsg(64); err != nil {
					break
				}
			}
		}
		// Two 4 KiB buffers, the greeting, the READY written, a first
		// chunk of 4 KiB, errors and properties: under 32 KiB, plus what
		// came in, three times over.
		if got, bound := totalAlloc()-before, uint64(3*len(data)+32<<10); got > bound {
			t.Fatalf("a handshake of %d bytes allocated %d bytes, over %d", len(data), got, bound)
		}
	})
}
