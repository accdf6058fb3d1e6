package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector/kvevents/internal/zmtp"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// testTimeout bounds every wait of these tests: generous, as a loaded
// machine may be slow.
const testTimeout = time.Minute

// openTest opens a publisher on ephemeral loopback ports, closed at the
// end of the test.
func openTest(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	if cfg.ReplayEndpoint == "" {
		cfg.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	if cfg.Medium == "" {
		cfg.Medium = MediumCPU
	}
	p, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// waitFor waits until cond holds, failing the test after testTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", testTimeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// subscribe connects a SUB peer to p, subscribed to topic, and waits
// until p counts it (the subscription is live: no message is lost to the
// slow-joiner race from then on).
func subscribe(t *testing.T, p *Publisher, topic string) *zmtp.Conn {
	t.Helper()
	before := p.Stats().Subscribers
	c, err := zmtp.Dial(context.Background(), p.Endpoint(), "SUB", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Limits = zmtp.Limits{Frame: 64 << 20, Bytes: 64 << 20, Frames: 16}
	t.Cleanup(func() { c.Close() })
	if err := c.WriteMsg([][]byte{append([]byte{1}, topic...)}); err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(p.cfg.Topic, topic) {
		waitFor(t, "the subscription", func() bool { return p.Stats().Subscribers > before })
	}
	return c
}

// recv reads one message from c within testTimeout.
func recv(t *testing.T, c *zmtp.Conn) [][]byte {
	t.Helper()
	c.SetDeadline(time.Now().Add(testTimeout))
	msg, err := c.ReadMsg()
	if err != nil {
		t.Fatalf("ReadMsg: %v", err)
	}
	return msg
}

// dealer connects a DEALER peer to p's replay endpoint.
func dealer(t *testing.T, p *Publisher) *zmtp.Conn {
	t.Helper()
	c, err := zmtp.Dial(context.Background(), p.ReplayEndpoint(), "DEALER", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Limits = zmtp.Limits{Frame: 64 << 20, Bytes: 64 << 20, Frames: 16}
	t.Cleanup(func() { c.Close() })
	return c
}

// replay requests the batches from start on over c and returns the
// replies before the end marker, each [topic, seq, payload], parsed as
// llm-d-router v0.10.0 parses them (routerReplayFrames).
func replay(t *testing.T, c *zmtp.Conn, start uint64) [][][]byte {
	t.Helper()
	if err := c.WriteMsg([][]byte{{}, binary.BigEndian.AppendUint64(nil, start)}); err != nil {
		t.Fatal(err)
	}
	var out [][][]byte
	for {
		m := recv(t, c)
		topic, seq, payload, end, err := routerReplayFrames(m)
		if err != nil {
			t.Fatalf("replay reply %x: %v", m, err)
		}
		if end {
			return out
		}
		out = append(out, [][]byte{topic, binary.BigEndian.AppendUint64(nil, uint64(seq)), payload})
	}
}

// routerReplayFrames parses one replay reply received on a DEALER socket
// as llm-d-router v0.10.0 does: after the empty delimiter it requires
// exactly three frames, [topic, seq, payload], seq 8 bytes big-endian and
// signed, and takes seq -1 for the end of the replay; it rejects anything
// else.
func routerReplayFrames(m [][]byte) (topic []byte, seq int64, payload []byte, end bool, err error) {
	if len(m) == 0 || len(m[0]) != 0 {
		return nil, 0, nil, false, fmt.Errorf("missing empty delimiter")
	}
	parts := m[1:]
	if len(parts) != 3 {
		return nil, 0, nil, false, fmt.Errorf("malformed replay frame with %d frames", len(parts))
	}
	if len(parts[1]) != 8 {
		return nil, 0, nil, false, fmt.Errorf("malformed sequence of %d bytes", len(parts[1]))
	}
	seq = int64(binary.BigEndian.Uint64(parts[1]))
	if seq == -1 {
		return nil, seq, nil, true, nil
	}
	return parts[0], seq, parts[2], false, nil
}

func seqOf(t *testing.T, b []byte) uint64 {
	t.Helper()
	if len(b) != 8 {
		t.Fatalf("sequence frame %x: want 8 bytes", b)
	}
	return binary.BigEndian.Uint64(b)
}

// kv is a map entry, kept in the order of the wire.
type kv struct {
	K string
	V any
}

// decode decodes msgpack b into nil, bool, int64 (every integer that fits),
// uint64, float64, string, []any and, for maps, []kv in wire order.
func decode(t *testing.T, b []byte) any {
	t.Helper()
	d := msgpack.NewDecoder(bytes.NewReader(b))
	v, err := decodeValue(d)
	if err != nil {
		t.Fatalf("decode %x: %v", b, err)
	}
	if _, err := d.PeekCode(); err == nil {
		t.Fatalf("decode %x: bytes after the value", b)
	}
	return v
}

func decodeValue(d *msgpack.Decoder) (any, error) {
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		m := []kv{}
		for range n {
			k, err := d.DecodeString()
			if err != nil {
				return nil, err
			}
			v, err := decodeValue(d)
			if err != nil {
				return nil, err
			}
			m = append(m, kv{k, v})
		}
		return m, nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		a := []any{}
		for range n {
			v, err := decodeValue(d)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		return a, nil
	}
	v, err := d.DecodeInterfaceLoose()
	if u, ok := v.(uint64); ok && u <= 1<<63-1 {
		v = int64(u)
	}
	return v, err
}

// wireInt is how decode returns an integer.
func wireInt(v uint64) any {
	if v <= 1<<63-1 {
		return int64(v)
	}
	return v
}

func wireHashes(hs []hashing.BlockHash) []any {
	out := []any{}
	for _, h := range hs {
		out = append(out, wireInt(h.Uint64()))
	}
	return out
}

// testHash returns a block hash whose fold is fold.
func testHash(i byte, fold uint64) hashing.BlockHash {
	var h hashing.BlockHash
	h[0] = i
	binary.BigEndian.PutUint64(h[24:], fold)
	return h
}

func mustPublish(t *testing.T, p *Publisher, events ...Event) {
	t.Helper()
	if err := p.Publish(events); err != nil {
		t.Fatalf("Publish: %v", err)
	}
}

func describe(v any) string { return fmt.Sprintf("%#v", v) }
