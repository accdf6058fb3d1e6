package kvevents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// sampleEvents returns events that use every field, and the fields each
// must have on the wire, in the order of vLLM's classes, tag first.
func sampleEvents() ([]Event, [][]kv) {
	h1, h2, h3 := testHash(1, 1<<63+5), testHash(2, 42), testHash(3, 1<<64-1)
	parent := testHash(9, 7)
	events := []Event{
		{Kind: BlockStored, Hashes: []hashing.BlockHash{h1, h2}, Parent: parent, Tokens: []hashing.Token{1, 2, 3, 4, 5, 6, 7, 151644},
			BlockSize: 4, LoraName: "sql-adapter", ExtraKeys: [][]ExtraKey{{{"img-3f2a", -2}, {"img-77c0", 1}}, nil}, Group: 1,
			SpecKind: "sliding_window", SlidingWindow: 128},
		{Kind: BlockStored, Hashes: []hashing.BlockHash{h3}, BlockSize: 4, Medium: MediumStorage},
		{Kind: BlockRemoved, Hashes: []hashing.BlockHash{h1, h3}, Group: 1, Medium: MediumGPU},
		{Kind: AllBlocksCleared},
	}
	want := [][]kv{
		{{"type", "BlockStored"}, {"block_hashes", []any{uint64(1<<63 + 5), int64(42)}}, {"parent_block_hash", int64(7)},
			{"token_ids", []any{int64(1), int64(2), int64(3), int64(4), int64(5), int64(6), int64(7), int64(151644)}},
			{"block_size", int64(4)}, {"lora_id", nil}, {"medium", "CPU"}, {"lora_name", "sql-adapter"},
			{"extra_keys", []any{[]any{[]any{"img-3f2a", int64(-2)}, []any{"img-77c0", int64(1)}}, nil}}, {"group_idx", int64(1)},
			{"kv_cache_spec_kind", "sliding_window"}, {"kv_cache_spec_sliding_window", int64(128)}},
		{{"type", "BlockStored"}, {"block_hashes", []any{uint64(1<<64 - 1)}}, {"parent_block_hash", nil},
			{"token_ids", []any{}}, {"block_size", int64(4)}, {"lora_id", nil}, {"medium", "STORAGE"}, {"lora_name", nil},
			{"extra_keys", []any{nil}}, {"group_idx", int64(0)}, {"kv_cache_spec_kind", "full_attention"}},
		{{"type", "BlockRemoved"}, {"block_hashes", []any{uint64(1<<63 + 5), uint64(1<<64 - 1)}}, {"medium", "GPU"}, {"group_idx", int64(1)}},
		{{"type", "AllBlocksCleared"}},
	}
	return events, want
}

// wireEvents returns want as events of format f: maps as they are, or
// positional arrays of the values, the tag first.
func wireEvents(want [][]kv, f Format) []any {
	out := []any{}
	for _, fields := range want {
		if f == FormatMap {
			out = append(out, fields)
			continue
		}
		a := []any{}
		for _, e := range fields {
			a = append(a, e.V)
		}
		out = append(out, a)
	}
	return out
}

// TestSubscriberDecodesEveryField publishes events with every field in
// both formats; a SUB peer decodes the frames and the payload.
func TestSubscriberDecodesEveryField(t *testing.T) {
	for _, f := range []Format{FormatMap, FormatArray} {
		t.Run(string(f), func(t *testing.T) {
			p := openTest(t, Config{Topic: "kv@pod-0@llama", Format: f, DataParallelRank: 3})
			sub := subscribe(t, p, "kv@")
			events, want := sampleEvents()
			before := time.Now()
			mustPublish(t, p, events...)
			mustPublish(t, p, events[3])
			after := time.Now()
			for seq, wantEvents := range [][]any{wireEvents(want, f), wireEvents(want[3:], f)} {
				m := recv(t, sub)
				if len(m) != 3 {
					t.Fatalf("message %d: %d frames, want 3", seq, len(m))
				}
				if string(m[0]) != "kv@pod-0@llama" {
					t.Errorf("topic = %q, want %q", m[0], "kv@pod-0@llama")
				}
				if got := seqOf(t, m[1]); got != uint64(seq) {
					t.Errorf("seq = %d, want %d", got, seq)
				}
				batch, ok := decode(t, m[2]).([]any)
				if !ok || len(batch) != 3 {
					t.Fatalf("payload %s: want the array [ts, events, dp_rank]", describe(batch))
				}
				ts, ok := batch[0].(float64)
				if !ok || ts < float64(before.UnixNano())/1e9-1e-3 || ts > float64(after.UnixNano())/1e9+1e-3 {
					t.Errorf("ts = %#v, want a float64 between %v and %v", batch[0], before, after)
				}
				if diff := cmp.Diff(wantEvents, batch[1]); diff != "" {
					t.Errorf("events (-want +got):\n%s", diff)
				}
				if batch[2] != int64(3) {
					t.Errorf("dp_rank = %#v, want 3", batch[2])
				}
			}
			// Replay resends the same bytes.
			live := [][]byte{}
			for _, m := range replay(t, dealer(t, p), 0) {
				live = append(live, m[2])
			}
			if len(live) != 2 {
				t.Fatalf("replay from 0 returned %d batches, want 2", len(live))
			}
		})
	}
}

// TestTopicFilter: a subscriber to another prefix receives nothing and is
// not counted.
func TestTopicFilter(t *testing.T) {
	p := openTest(t, Config{Topic: "kv@a"})
	other := subscribe(t, p, "kv@b")
	sub := subscribe(t, p, "")
	mustPublish(t, p, Event{Kind: AllBlocksCleared})
	if m := recv(t, sub); string(m[0]) != "kv@a" {
		t.Fatalf("topic %q, want kv@a", m[0])
	}
	if n := p.Stats().Subscribers; n != 1 {
		t.Errorf("Stats().Subscribers = %d, want 1", n)
	}
	other.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if m, err := other.ReadMsg(); err == nil {
		t.Errorf("subscriber of kv@b received %q", m)
	}
}

// TestReplay: replay returns exactly the buffered batches from the start
// asked for, then the end marker; the buffer keeps the latest
// buffer_steps batches.
func TestReplay(t *testing.T) {
	p := openTest(t, Config{BufferSteps: 4})
	sub := subscribe(t, p, "")
	var payloads [][]byte
	for i := range 6 {
		mustPublish(t, p, Event{Kind: BlockRemoved, Hashes: []hashing.BlockHash{testHash(0, uint64(i))}})
		m := recv(t, sub)
		if got := seqOf(t, m[1]); got != uint64(i) {
			t.Fatalf("live seq = %d, want %d", got, i)
		}
		payloads = append(payloads, m[2])
	}
	d := dealer(t, p)
	for _, tt := range []struct {
		start uint64
		want  []uint64
	}{
		{0, []uint64{2, 3, 4, 5}},
		{2, []uint64{2, 3, 4, 5}},
		{4, []uint64{4, 5}},
		{5, []uint64{5}},
		{6, nil},
		{1 << 63, nil},
	} {
		var got []uint64
		for _, m := range replay(t, d, tt.start) {
			s := seqOf(t, m[1])
			got = append(got, s)
			if !bytes.Equal(m[2], payloads[s]) {
				t.Errorf("replay from %d: batch %d differs from the live one", tt.start, s)
			}
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("replay from %d: seqs (-want +got):\n%s", tt.start, diff)
		}
	}
	if n := p.Stats().Replays; n != 6 {
		t.Errorf("Stats().Replays = %d, want 6", n)
	}
	// A malformed request gets no reply; the next valid one does.
	if err := d.WriteMsg([][]byte{{}, {1, 2, 3, 4, 5, 6, 7, 8, 9}}); err != nil {
		t.Fatal(err)
	}
	if got := replay(t, d, 5); len(got) != 1 || seqOf(t, got[0][1]) != 5 {
		t.Errorf("replay from 5 after a malformed request: %x", got)
	}
}

// TestPublishDoesNotBlock: with the sender held, Publish queues up to
// max_queue_size batches and drops (and counts) the rest without blocking.
func TestPublishDoesNotBlock(t *testing.T) {
	p := openTest(t, Config{MaxQueueSize: 2})
	ev := Event{Kind: BlockRemoved, Hashes: []hashing.BlockHash{testHash(0, 1), testHash(0, 2)}}
	p.ring.Lock() // the sender blocks in send, with the first batch taken
	mustPublish(t, p, ev)
	waitFor(t, "the sender to take the first batch", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.mu.queue) == 0
	})
	for range 5 {
		mustPublish(t, p, ev)
	}
	st := p.Stats()
	p.ring.Unlock()
	if st.DroppedBatches != 3 || st.DroppedEvents != 3 {
		t.Errorf("Stats() = %+v, want 3 dropped batches of 3 events", st)
	}
	waitFor(t, "the queued batches", func() bool { return p.Stats().Batches == 3 })
}

// TestCloseDrainsAndJoins: Close sends what was queued, stops Publish and
// leaves no goroutine behind.
func TestCloseDrainsAndJoins(t *testing.T) {
	base := runtime.NumGoroutine()
	p, err := Open(context.Background(), Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Medium: MediumCPU})
	if err != nil {
		t.Fatal(err)
	}
	sub := subscribe(t, p, "")
	d := dealer(t, p)
	if err := d.WriteMsg([][]byte{{}, make([]byte, 8)}); err != nil {
		t.Fatal(err)
	}
	const n = 200
	for i := range n {
		mustPublish(t, p, Event{Kind: BlockRemoved, Hashes: []hashing.BlockHash{testHash(0, uint64(i))}})
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.Publish([]Event{{Kind: AllBlocksCleared}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
	for i := range n {
		if got := seqOf(t, recv(t, sub)[1]); got != uint64(i) {
			t.Fatalf("seq %d after Close, want %d", got, i)
		}
	}
	if st := p.Stats(); st.Batches != n || st.DroppedBatches != 0 {
		t.Errorf("Stats() = %+v, want %d batches sent, none dropped", st, n)
	}
	sub.Close()
	d.Close()
	waitFor(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
}

func TestConfigErrors(t *testing.T) {
	ok := Config{Endpoint: "tcp://127.0.0.1:0", Medium: MediumCPU}
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no endpoint", func(c *Config) { c.Endpoint = "" }, `endpoint = "": required`},
		{"ipc endpoint", func(c *Config) { c.Endpoint = "ipc:///tmp/kv" }, `endpoint = "ipc:///tmp/kv": want tcp://host:port`},
		{"no port", func(c *Config) { c.Endpoint = "tcp://127.0.0.1" }, `endpoint = "tcp://127.0.0.1"`},
		{"bad replay", func(c *Config) { c.ReplayEndpoint = "udp://x:1" }, `replay_endpoint = "udp://x:1"`},
		{"same replay", func(c *Config) { c.Endpoint = "tcp://127.0.0.1:5557"; c.ReplayEndpoint = c.Endpoint }, `replay_endpoint = "tcp://127.0.0.1:5557": the same as endpoint`},
		{"buffer_steps", func(c *Config) { c.BufferSteps = -1 }, "buffer_steps = -1: negative"},
		{"hwm", func(c *Config) { c.HWM = -2 }, "hwm = -2: negative"},
		{"max_queue_size", func(c *Config) { c.MaxQueueSize = -3 }, "max_queue_size = -3: negative"},
		{"medium", func(c *Config) { c.Medium = "" }, `medium = "": required`},
		{"dp rank", func(c *Config) { c.DataParallelRank = -1 }, "data_parallel_rank = -1"},
		{"format", func(c *Config) { c.Format = "json" }, `format = "json": want "map" or "array"`},
		{"close timeout", func(c *Config) { c.CloseTimeout = -time.Second }, "CloseTimeout = -1s"},
		{"max_peers", func(c *Config) { c.MaxPeers = -1 }, "max_peers = -1: negative"},
		{"mode", func(c *Config) { c.Mode = "listen" }, `mode = "listen": want "" (vLLM's rule), "bind" or "connect"`},
		{"connect to port 0", func(c *Config) { c.Mode = ModeConnect }, `endpoint = "tcp://127.0.0.1:0": port 0 with mode "connect"`},
		{"topic NUL", func(c *Config) { c.Topic = "kv@pod\x00@m" }, `topic = "kv@pod\x00@m": control character U+0000 at byte 6`},
		{"topic newline", func(c *Config) { c.Topic = "kv@pod\n" }, `topic = "kv@pod\n": control character U+000A at byte 6`},
		{"topic not UTF-8", func(c *Config) { c.Topic = "kv@\xff\xfe" }, `topic = "kv@\xff\xfe": not valid UTF-8`},
		{"topic 1 MiB", func(c *Config) { c.Topic = strings.Repeat("k", 1<<20) }, `topic = "` + strings.Repeat("k", 64) + `"... (1048576 bytes): over 256 bytes`},
		{"topic 257 bytes", func(c *Config) { c.Topic = strings.Repeat("é", 128) + "k" }, `(257 bytes): over 256 bytes`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.edit(&c)
			p, err := Open(context.Background(), c)
			if err == nil {
				p.Close()
				t.Fatalf("Open(%+v) = nil error, want %q", c, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "kvevents: ") {
				t.Errorf("Open(%+v) = %v, want an error containing %q", c, err, tt.want)
			}
		})
	}
	// A context that has ended opens nothing, in either mode.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, mode := range []Mode{ModeBind, ModeConnect} {
		c := ok
		c.Endpoint, c.Mode = "tcp://127.0.0.1:5557", mode
		if p, err := Open(ended, c); !errors.Is(err, context.Canceled) {
			if err == nil {
				p.Close()
			}
			t.Errorf("Open(canceled context, mode %q) = %v, want context.Canceled", mode, err)
		}
	}
	// A port in use: the error names the field.
	p := openTest(t, Config{})
	c := ok
	c.Endpoint, c.Mode = p.Endpoint(), ModeBind
	if _, err := Open(context.Background(), c); err == nil || !strings.Contains(err.Error(), "kvevents: endpoint: ") {
		t.Errorf("Open on a port in use = %v, want an endpoint error", err)
	}
	c = ok
	c.ReplayEndpoint = p.Endpoint()
	if _, err := Open(context.Background(), c); err == nil || !strings.Contains(err.Error(), "kvevents: replay_endpoint: ") {
		t.Errorf("Open with a replay port in use = %v, want a replay_endpoint error", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	got := Config{}.EnsureDefaults()
	if got.BufferSteps != 10000 || got.HWM != 100000 || got.MaxQueueSize != 100000 || got.Format != FormatMap || got.CloseTimeout != time.Second {
		t.Errorf("Config{}.EnsureDefaults() = %+v, want vLLM's defaults", got)
	}
}

func TestEventErrors(t *testing.T) {
	h := []hashing.BlockHash{testHash(0, 1)}
	tests := []struct {
		e    Event
		want string
	}{
		{Event{}, "events[1].Kind = 0"},
		{Event{Kind: BlockRemoved}, "events[1].Hashes: empty"},
		{Event{Kind: BlockRemoved, Hashes: h, Group: -1}, "events[1].Group = -1"},
		{Event{Kind: BlockStored, Hashes: h}, "events[1].BlockSize = 0"},
		{Event{Kind: BlockStored, Hashes: h, BlockSize: 2, Tokens: []hashing.Token{1}}, "events[1].Tokens: 1 token ids for 1 blocks of 2 tokens, want 2 or none"},
		{Event{Kind: BlockStored, Hashes: h, BlockSize: 2, ExtraKeys: [][]ExtraKey{nil, nil}}, "events[1].ExtraKeys: 2 entries for 1 blocks"},
		{Event{Kind: BlockStored, Hashes: h, BlockSize: 2, ExtraKeys: [][]ExtraKey{{{"", 0}}}}, "events[1].ExtraKeys[0][0].Identifier: empty"},
		{Event{Kind: BlockStored, Hashes: h, BlockSize: 2, ExtraKeys: [][]ExtraKey{{{"img", 2}}}}, "events[1].ExtraKeys[0][0].Offset = 2"},
		{Event{Kind: BlockStored, Hashes: h, BlockSize: 2, SlidingWindow: -1}, "events[1].SlidingWindow = -1"},
	}
	p := openTest(t, Config{})
	for _, tt := range tests {
		err := p.Publish([]Event{{Kind: AllBlocksCleared}, tt.e})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Publish(%+v) = %v, want an error containing %q", tt.e, err, tt.want)
		}
	}
	if st := p.Stats(); st.Batches != 0 {
		t.Errorf("Stats().Batches = %d after invalid batches, want 0", st.Batches)
	}
}

func TestFromConnector(t *testing.T) {
	hs := []hashing.BlockHash{testHash(0, 1), testHash(0, 2)}
	tests := []struct {
		in   connector.KVEvent
		want Event
	}{
		{connector.KVEvent{Kind: connector.BlockStored, Generation: 3, Group: 1, Hashes: hs}, Event{Kind: BlockStored, Hashes: hs, Group: 1, BlockSize: 16}},
		{connector.KVEvent{Kind: connector.BlockStored, Hashes: hs[1:], Parent: hs[0], BlockSize: 2, Tokens: []hashing.Token{5, 6}}, Event{Kind: BlockStored, Hashes: hs[1:], Parent: hs[0], BlockSize: 2, Tokens: []hashing.Token{5, 6}}},
		{connector.KVEvent{Kind: connector.BlockRemoved, Hashes: hs[:1]}, Event{Kind: BlockRemoved, Hashes: hs[:1], BlockSize: 16}},
		{connector.KVEvent{Kind: connector.AllCleared}, Event{Kind: AllBlocksCleared, BlockSize: 16}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, FromConnector(tt.in, 16)); diff != "" {
			t.Errorf("FromConnector(%+v, 16) (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{BlockStored: "BlockStored", BlockRemoved: "BlockRemoved", AllBlocksCleared: "AllBlocksCleared", 9: "Kind(9)"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", uint8(k), got, want)
		}
	}
}

// TestStalledSubscriber: a subscriber that never reads loses messages past
// its HWM (counted), delays neither Publish nor another subscriber, and
// Close still returns within its bound and joins every goroutine.
func TestStalledSubscriber(t *testing.T) {
	base := runtime.NumGoroutine()
	p, err := Open(context.Background(), Config{Endpoint: "tcp://127.0.0.1:0", Medium: MediumCPU, HWM: 4, CloseTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stalled := subscribe(t, p, "")
	reader := subscribe(t, p, "")
	tokens := make([]hashing.Token, 64*1024) // 64 Ki tokens: socket buffers fill after a few batches
	ev := Event{Kind: BlockStored, Hashes: []hashing.BlockHash{testHash(0, 1)}, BlockSize: len(tokens), Tokens: tokens}
	const n = 200
	for i := range n {
		mustPublish(t, p, ev)
		// The reader keeps up, so its queue never reaches the HWM.
		if got := seqOf(t, recv(t, reader)[1]); got != uint64(i) {
			t.Fatalf("reader: seq %d, want %d", got, i)
		}
	}
	if st := p.Stats(); st.SubscriberDrops == 0 || st.Batches != n {
		t.Errorf("Stats() = %+v, want %d batches and drops for the stalled subscriber", st, n)
	}
	// The stalled subscriber never reads: a Close that waited for it
	// would never return. (About 2 x CloseTimeout is what it takes; the
	// bound is a minute, which no pause of a loaded machine reaches.)
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("Close had not returned a minute after it began, with a stalled subscriber; want about 2 x CloseTimeout (200 ms): it waits for the subscriber")
	}
	stalled.Close()
	reader.Close()
	waitFor(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
}

// TestConfigFromVLLMJSON: the JSON of vLLM's --kv-events-config decodes,
// its enable_kv_cache_events and publisher ignored.
func TestConfigFromVLLMJSON(t *testing.T) {
	var c Config
	in := `{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557",
		"replay_endpoint": null, "buffer_steps": 500, "hwm": 1000, "max_queue_size": 2000, "topic": "kv@pod@m", "medium": "STORAGE"}`
	if err := json.Unmarshal([]byte(in), &c); err != nil {
		t.Fatal(err)
	}
	want := Config{Endpoint: "tcp://127.0.0.1:5557", BufferSteps: 500, HWM: 1000, MaxQueueSize: 2000, Topic: "kv@pod@m", Medium: MediumStorage}
	if diff := cmp.Diff(want, c, cmpopts.IgnoreFields(Config{}, "Logger")); diff != "" {
		t.Errorf("json.Unmarshal(%s) (-want +got):\n%s", in, diff)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
}
