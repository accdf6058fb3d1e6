package kvevents

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/connector/kvevents/internal/zmtp"
	"github.com/kvconnect/kvconnect/hashing"
)

// TestModeRule: ModeAuto binds as vLLM does (a wildcard host, or "::" in
// it) and connects otherwise; port 0 binds; ModeBind and ModeConnect
// override.
func TestModeRule(t *testing.T) {
	for _, tt := range []struct {
		endpoint string
		mode     Mode
		bind     bool
	}{
		{"tcp://*:5557", ModeAuto, true},
		{"tcp://[::]:5557", ModeAuto, true},
		{"tcp://[::1]:5557", ModeAuto, true},
		{"tcp://127.0.0.1:5557", ModeAuto, false},
		{"tcp://0.0.0.0:5557", ModeAuto, false},
		{"tcp://router.example:5557", ModeAuto, false},
		{"tcp://127.0.0.1:0", ModeAuto, true},
		{"tcp://127.0.0.1:5557", ModeBind, true},
		{"tcp://*:5557", ModeConnect, false},
	} {
		if got := (Config{Endpoint: tt.endpoint, Mode: tt.mode}).Binds(); got != tt.bind {
			t.Errorf("Config{Endpoint: %q, Mode: %q}.Binds() = %v, want %v", tt.endpoint, tt.mode, got, tt.bind)
		}
	}
}

// bindingSUB is a SUB socket that binds, as llm-d's static-endpoint mode
// does, built from the package's ZMTP connection.
type bindingSUB struct {
	t  *testing.T
	ln *net.TCPListener
}

func newBindingSUB(t *testing.T) *bindingSUB {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &bindingSUB{t: t, ln: ln.(*net.TCPListener)}
}

func (b *bindingSUB) endpoint() string { return "tcp://" + b.ln.Addr().String() }

// accept waits for the publisher to connect, completes the handshake and
// subscribes to topic.
func (b *bindingSUB) accept(topic string) *zmtp.Conn {
	b.t.Helper()
	b.ln.SetDeadline(time.Now().Add(testTimeout))
	nc, err := b.ln.Accept()
	if err != nil {
		b.t.Fatalf("waiting for the publisher to connect: %v", err)
	}
	c, err := zmtp.Handshake(nc, "SUB", nil)
	if err != nil {
		b.t.Fatal(err)
	}
	c.Limits = zmtp.Limits{Frame: 64 << 20, Bytes: 64 << 20, Frames: 16}
	b.t.Cleanup(func() { c.Close() })
	if err := c.WriteMsg([][]byte{append([]byte{1}, topic...)}); err != nil {
		b.t.Fatal(err)
	}
	return c
}

// TestConnectToBindingSUB: with an endpoint that is not a wildcard, the
// publisher connects to a SUB that binds (llm-d's static-endpoint mode),
// delivers to it, counts what it publishes while disconnected, delivers
// that within the HWM once the SUB is back, and replays all of it.
func TestConnectToBindingSUB(t *testing.T) {
	sub := newBindingSUB(t)
	p := openTest(t, Config{Endpoint: sub.endpoint(), Topic: "kv@pod@m", HWM: 8})
	if p.Endpoint() != sub.endpoint() {
		t.Errorf("Endpoint() = %q, want %q", p.Endpoint(), sub.endpoint())
	}
	ev := func(i int) Event {
		return Event{Kind: BlockRemoved, Hashes: []hashing.BlockHash{testHash(0, uint64(i))}}
	}
	// Before the SUB accepts: no subscription is known, so nothing is
	// queued, but the batch is counted and buffered for replay.
	mustPublish(t, p, ev(0))
	waitFor(t, "the batch sent while disconnected", func() bool { return p.Stats().Disconnected == 1 })

	c := sub.accept("kv@")
	waitFor(t, "the subscription over the connection", func() bool { return p.Stats().Subscribers == 1 })
	mustPublish(t, p, ev(1))
	if m := recv(t, c); string(m[0]) != "kv@pod@m" || seqOf(t, m[1]) != 1 {
		t.Fatalf("live message %q, want topic kv@pod@m, seq 1", m[:2])
	}

	// The SUB goes away; what is published meanwhile waits for it.
	c.Close()
	waitFor(t, "the publisher to see the SUB leave", func() bool { return p.Stats().Subscribers == 0 })
	for i := 2; i < 5; i++ {
		mustPublish(t, p, ev(i))
	}
	waitFor(t, "the batches sent while disconnected", func() bool { return p.Stats().Disconnected == 4 })
	c = sub.accept("kv@")
	for want := uint64(2); want < 5; want++ {
		if got := seqOf(t, recv(t, c)[1]); got != want {
			t.Fatalf("after reconnecting: seq %d, want %d", got, want)
		}
	}
	var seqs []uint64
	for _, m := range replay(t, dealer(t, p), 0) {
		seqs = append(seqs, seqOf(t, m[1]))
	}
	if diff := cmp.Diff([]uint64{0, 1, 2, 3, 4}, seqs); diff != "" {
		t.Errorf("replay from 0 (-want +got):\n%s", diff)
	}
	if st := p.Stats(); st.Connects != 2 || st.Batches != 5 {
		t.Errorf("Stats() = %+v, want 2 connects and 5 batches", st)
	}
}

// TestConnectGarbage: a binding peer that sends garbage to the connecting
// publisher is dropped and counted, and the publisher connects again.
func TestConnectGarbage(t *testing.T) {
	sub := newBindingSUB(t)
	p := openTest(t, Config{Endpoint: sub.endpoint()})
	c := sub.accept("")
	waitFor(t, "the subscription", func() bool { return p.Stats().Subscribers == 1 })
	// A command inside a multipart message breaks ZMTP.
	if err := c.WriteMsg([][]byte{{1}}); err != nil {
		t.Fatal(err)
	}
	raw := []byte{0x01, 0x01, 'x', 0x04, 0x05, 4, 'P', 'I', 'N', 'G'}
	if err := c.WriteRaw(raw); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the garbage peer to be counted", func() bool { return p.Stats().PeersMalformed == 1 })
	sub.accept("")
	waitFor(t, "the publisher to connect again", func() bool { return p.Stats().Connects == 2 && p.Stats().Subscribers == 1 })
}

// TestUnreachableEndpoint: an endpoint nobody listens on, and one whose
// name does not resolve, open at once; Publish never waits, the attempts
// are counted, and Close returns and joins every goroutine.
func TestUnreachableEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "tcp://" + ln.Addr().String()
	ln.Close()
	for _, endpoint := range []string{closed, "tcp://kvconnect-no-such-host.invalid:5557"} {
		t.Run(endpoint, func(t *testing.T) {
			base := runtime.NumGoroutine()
			p, err := Open(context.Background(), Config{Endpoint: endpoint, Medium: MediumCPU, MaxQueueSize: 4})
			if err != nil {
				t.Fatalf("Open(%q) = %v, want the publisher to retry in the background", endpoint, err)
			}
			for i := range 100 {
				mustPublish(t, p, Event{Kind: BlockRemoved, Hashes: []hashing.BlockHash{testHash(0, uint64(i))}})
			}
			waitFor(t, "counted connection failures", func() bool { return p.Stats().ConnectFailures >= 2 })
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			st := p.Stats()
			if st.Batches+st.DroppedBatches != 100 || st.Disconnected != st.Batches {
				t.Errorf("Stats() = %+v, want 100 batches sent or dropped, every sent one while disconnected", st)
			}
			waitFor(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
		})
	}
}

// TestPeerBoundsInStats: the publisher's sockets drop peers over their
// bounds and Stats counts them by bound: too many peers, a subscription
// flood, an oversize replay request; malformed replay requests are
// counted too, and a request past the ring gets the end marker alone.
func TestPeerBoundsInStats(t *testing.T) {
	p := openTest(t, Config{MaxPeers: 2})
	a := subscribe(t, p, "")
	_ = subscribe(t, p, "kv")
	// A third peer of the PUB socket is over MaxPeers.
	addr, _ := zmtp.TCPAddr(p.Endpoint())
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	waitFor(t, "the third peer to be refused", func() bool { return p.Stats().PeersRefused == 1 })
	// A subscription flood from a peer within the count.
	for i := range 1000 {
		if err := a.WriteMsg([][]byte{fmt.Appendf(nil, "\x01p%d", i)}); err != nil {
			break
		}
	}
	waitFor(t, "the flood to be counted", func() bool { return p.Stats().PeersOverSubscribed == 1 })

	mustPublish(t, p, Event{Kind: AllBlocksCleared})
	waitFor(t, "the batch to be sent", func() bool { return p.Stats().Batches == 1 })
	d := dealer(t, p)
	if got := replay(t, d, 1); len(got) != 0 {
		t.Errorf("replay from 1 with only seq 0 buffered: %d batches, want the end marker alone", len(got))
	}
	if err := d.WriteMsg([][]byte{{}, {1, 2, 3, 4, 5, 6, 7, 8, 9}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the malformed request to be counted", func() bool { return p.Stats().ReplayMalformed == 1 })
	if err := d.WriteMsg([][]byte{{}, bytes.Repeat([]byte{0}, 2<<10)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the oversize request to be counted", func() bool { return p.Stats().PeersOversize == 1 })
}

// TestLegacyReplay: with LegacyReplay the replies are vLLM's before 0.26,
// [seq, payload] and [-1, ""], which llm-d-router v0.10.0 rejects; the
// default replies are what it reads.
func TestLegacyReplay(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		p := openTest(t, Config{Topic: "kv@pod@m", LegacyReplay: legacy})
		mustPublish(t, p, Event{Kind: AllBlocksCleared})
		waitFor(t, "the batch to be sent", func() bool { return p.Stats().Batches == 1 })
		d := dealer(t, p)
		if err := d.WriteMsg([][]byte{{}, make([]byte, 8)}); err != nil {
			t.Fatal(err)
		}
		batch, end := recv(t, d), recv(t, d)
		_, _, _, _, errBatch := routerReplayFrames(batch)
		_, _, _, isEnd, errEnd := routerReplayFrames(end)
		if !legacy {
			if errBatch != nil || errEnd != nil || !isEnd || string(batch[1]) != "kv@pod@m" {
				t.Errorf("default replay %q then %x: the router's parser says %v, %v", batch[:3], end, errBatch, errEnd)
			}
			continue
		}
		if len(batch) != 3 || seqOf(t, batch[1]) != 0 || len(end) != 3 || !bytes.Equal(end[1], endSeq) || len(end[2]) != 0 {
			t.Errorf("legacy replay %x then %x, want [\"\", seq, payload] and [\"\", -1, \"\"]", batch[:2], end)
		}
		if errBatch == nil || errBatch.Error() != "malformed replay frame with 2 frames" {
			t.Errorf("the router's parser of a legacy reply: %v, want it rejected as llm-d-router v0.10.0 does", errBatch)
		}
	}
}

// TestReplayClientThatNeverReads: a replay client that asks again and
// again and reads nothing holds at most one whole replay; the rest is
// dropped and counted, and Publish and other clients go on.
func TestReplayClientThatNeverReads(t *testing.T) {
	p := openTest(t, Config{BufferSteps: 8})
	tokens := make([]hashing.Token, 64*1024) // batches of 256 KiB: the socket buffers fill at once
	ev := Event{Kind: BlockStored, Hashes: []hashing.BlockHash{testHash(0, 1)}, BlockSize: len(tokens), Tokens: tokens}
	for range 8 {
		mustPublish(t, p, ev)
	}
	waitFor(t, "the batches to be sent", func() bool { return p.Stats().Batches == 8 })
	lazy := dealer(t, p)
	for range 20 {
		if err := lazy.WriteMsg([][]byte{{}, make([]byte, 8)}); err != nil {
			t.Fatal(err)
		}
	}
	// 20 replays of 9 replies each (8 of 256 KiB, 40 MiB in all): at most
	// 9 queued, 9 more taken by the writer, and what the kernel's buffers
	// hold (a few MiB, at most a few tens of replies); a whole replay's
	// worth at least is dropped (with the HWM as the queue's bound, none
	// would be).
	waitFor(t, "the replies over the queue to be dropped", func() bool {
		st := p.Stats()
		return st.Replays == 20 && st.ReplayDrops >= 9
	})
	mustPublish(t, p, ev)
	waitFor(t, "the last batch to be sent", func() bool { return p.Stats().Batches == 9 })
	if got := replay(t, dealer(t, p), 8); len(got) != 1 {
		t.Errorf("another client's replay from 8: %d batches, want 1", len(got))
	}
}
