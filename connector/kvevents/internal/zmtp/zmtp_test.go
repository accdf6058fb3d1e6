package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

// testLimits are the bounds of the sockets of these tests but those that
// test a bound.
var testLimits = SocketLimits{
	Msg:   Limits{Frame: 1 << 16, Bytes: 1 << 16, Frames: 16, MsgTimeout: time.Minute},
	Peers: 16, Idle: time.Minute, Subs: 8, SubBytes: 1 << 10,
}

// TestHandshakeRefusesIncompatiblePeers: a PUB socket refuses a DEALER
// peer, and a ROUTER socket a SUB peer.
func TestHandshakeRefusesIncompatiblePeers(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	pub, err := ListenPub(context.Background(), "tcp://127.0.0.1:0", 10, testLimits, log)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(0)
	router, err := ListenRouter(context.Background(), "tcp://127.0.0.1:0", 10, testLimits, log)
	if err != nil {
		t.Fatal(err)
	}
	defer router.Close(0)
	for _, tt := range []struct{ endpoint, typ string }{{pub.Endpoint(), "DEALER"}, {router.Endpoint(), "SUB"}} {
		c, err := Dial(context.Background(), tt.endpoint, tt.typ, nil)
		if err == nil {
			// The server closes the connection after its READY.
			c.SetDeadline(time.Now().Add(10 * time.Second))
			_, err = c.ReadMsg()
			c.Close()
		}
		if err == nil {
			t.Errorf("a %s peer of %s was served", tt.typ, tt.endpoint)
		}
	}
}

// TestRouterRoutesByIdentity: two DEALER peers, one with an identity of
// its own; replies reach only the peer named.
func TestRouterRoutesByIdentity(t *testing.T) {
	router, err := ListenRouter(context.Background(), "tcp://127.0.0.1:0", 10, testLimits, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer router.Close(0)
	a, err := Dial(context.Background(), router.Endpoint(), "DEALER", []byte("peer-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Dial(context.Background(), router.Endpoint(), "DEALER", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []*Conn{a, b} {
		if err := c.WriteMsg([][]byte{{}, []byte("hello")}); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[string]bool{}
	for range 2 {
		m, err := router.Recv(nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(m) != 3 || string(m[2]) != "hello" {
			t.Fatalf("Recv = %q, want [id, \"\", hello]", m)
		}
		ids[string(m[0])] = true
		if ok, err := router.Send([][]byte{m[0], {}, append([]byte("to "), m[0]...)}); !ok || err != nil {
			t.Fatalf("Send to %q = %v, %v", m[0], ok, err)
		}
	}
	if !ids["peer-a"] || len(ids) != 2 {
		t.Errorf("identities %v, want peer-a and a generated one", ids)
	}
	for _, c := range []*Conn{a, b} {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		m, err := c.ReadMsg()
		if err != nil {
			t.Fatal(err)
		}
		if len(m) != 2 || len(m[0]) != 0 || !bytes.HasPrefix(m[1], []byte("to ")) {
			t.Errorf("reply %q", m)
		}
		if c == a && string(m[1]) != "to peer-a" {
			t.Errorf("peer-a received %q", m[1])
		}
	}
	if ok, err := router.Send([][]byte{[]byte("nobody"), {}}); ok || err != nil {
		t.Errorf("Send to an unknown identity = %v, %v; want false, nil", ok, err)
	}
}

// TestLongFrames: a frame over 255 bytes takes the long form, and a PUB
// socket delivers it to a subscriber once the subscription is counted.
func TestLongFrames(t *testing.T) {
	pub, err := ListenPub(context.Background(), "tcp://127.0.0.1:0", 10, testLimits, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(0)
	sub, err := Dial(context.Background(), pub.Endpoint(), "SUB", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.WriteMsg([][]byte{{1}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for pub.Subscribers([]byte("t")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the subscription was not counted")
		}
		time.Sleep(time.Millisecond)
	}
	big := bytes.Repeat([]byte{7}, 70000)
	if err := pub.Send([][]byte{[]byte("t"), big}); err != nil {
		t.Fatal(err)
	}
	sub.Limits.Frame = 1 << 20
	sub.SetDeadline(time.Now().Add(10 * time.Second))
	m, err := sub.ReadMsg()
	if err != nil || len(m) != 2 || !bytes.Equal(m[1], big) {
		t.Fatalf("ReadMsg = %d frames, %v", len(m), err)
	}
}

// FuzzReadMsg: ReadMsg of any bytes returns a message or an error, and
// never allocates past MaxFrame for one frame.
func FuzzReadMsg(f *testing.F) {
	f.Add([]byte{0x00, 0x01, 'a'})
	f.Add([]byte{0x01, 0x00, 0x00, 0x02, 'h', 'i'})
	f.Add([]byte{0x04, 0x0a, 0x09, 'S', 'U', 'B', 'S', 'C', 'R', 'I', 'B', 'E'})
	f.Add([]byte{0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &Conn{br: bufio.NewReader(bytes.NewReader(data)), bw: bufio.NewWriter(io.Discard), Limits: Limits{Frame: 1 << 16, Bytes: 1 << 17, Frames: 16}}
		for range 8 {
			m, err := c.ReadMsg()
			if err != nil {
				return
			}
			if len(m) == 0 {
				t.Fatal("ReadMsg returned no frames and no error")
			}
		}
	})
}

// FuzzParseProperties: READY metadata of any bytes parses or fails.
func FuzzParseProperties(f *testing.F) {
	f.Add(appendProperty(appendProperty(nil, "Socket-Type", []byte("SUB")), "Identity", nil))
	f.Add([]byte{5, 'a'})
	f.Fuzz(func(t *testing.T, data []byte) {
		props, err := parseProperties(data)
		if err != nil {
			return
		}
		var again []byte
		for k, v := range props {
			again = appendProperty(again, k, v)
		}
		if _, err := parseProperties(again); err != nil {
			t.Fatalf("re-encoded properties do not parse: %v", err)
		}
	})
}
