package kvevents

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvconnect/kvconnect/connector/kvevents/internal/zmtp"
)

// Defaults of [Config], vLLM's KVEventsConfig defaults.
const (
	DefaultBufferSteps  = 10000
	DefaultHWM          = 100000
	DefaultMaxQueueSize = 100000
	// DefaultMaxPeers is the default of Config.MaxPeers.
	DefaultMaxPeers = 64
	// MaxTopicBytes bounds Config.Topic.
	MaxTopicBytes = 256
)

// Bounds on what the sockets' peers send and hold (see the package doc,
// "Security"). A peer over one is disconnected and counted in [Stats].
const (
	// pubIdle: a subscriber subscribes within it after its handshake.
	pubIdle = 60 * time.Second
	// replayIdle: a replay client sends each request within it.
	replayIdle = 60 * time.Second
	// msgTimeout: a message, once begun, arrives whole within it.
	msgTimeout = 10 * time.Second
	// maxSubs and maxSubBytes bound one subscriber's subscriptions.
	maxSubs     = 64
	maxSubBytes = 4 << 10
	// pubMsgBytes and pubMsgFrames bound a message a subscriber sends (a
	// subscription is one frame; the rest is read and discarded).
	pubMsgBytes  = 64 << 10
	pubMsgFrames = 16
	// replayMsgBytes and replayMsgFrames bound a replay request (two
	// frames of at most 8 bytes; a REQ socket may add a request id).
	replayMsgBytes  = 1 << 10
	replayMsgFrames = 4
)

func pubLimits(c Config) zmtp.SocketLimits {
	return zmtp.SocketLimits{
		Msg:   zmtp.Limits{Frame: pubMsgBytes, Bytes: pubMsgBytes, Frames: pubMsgFrames, MsgTimeout: msgTimeout},
		Peers: c.MaxPeers, Idle: pubIdle, Subs: maxSubs, SubBytes: maxSubBytes,
	}
}

func replayLimits(c Config) zmtp.SocketLimits {
	return zmtp.SocketLimits{
		Msg:   zmtp.Limits{Frame: replayMsgBytes, Bytes: replayMsgBytes, Frames: replayMsgFrames, MsgTimeout: msgTimeout},
		Peers: c.MaxPeers, Idle: replayIdle,
	}
}

// Mode is whether the PUB socket binds its endpoint or connects to it.
type Mode string

const (
	// ModeAuto follows vLLM: bind an endpoint whose host is a wildcard
	// (tcp://*:5557, or an IPv6 host with "::" as tcp://[::]:5557), and
	// connect to any other, for a subscriber that binds (llm-d's
	// static-endpoint mode). An endpoint with port 0 binds too: there is
	// nothing to connect to.
	ModeAuto Mode = ""
	// ModeBind binds the endpoint whatever its host, for example
	// tcp://127.0.0.1:5557 to serve subscribers of this host only.
	ModeBind Mode = "bind"
	// ModeConnect connects to the endpoint whatever its host.
	ModeConnect Mode = "connect"
)

// Format is how events are written inside a batch.
type Format string

const (
	// FormatMap writes each event as a msgpack map tagged "type", the
	// format of vLLM since 2026-06 (vLLM PR 42892).
	FormatMap Format = "map"
	// FormatArray writes each event as a positional array with the tag
	// first (msgspec array_like), for consumers older than FormatMap.
	FormatArray Format = "array"
)

// Config configures a [Publisher]. The JSON names of the fields that vLLM's
// KVEventsConfig has are vLLM's, so that a --kv-events-config JSON object
// decodes into it (enable_kv_cache_events and publisher are not fields:
// opening a Publisher is enabling it, and it is always "zmq").
type Config struct {
	// Endpoint is where the PUB socket binds, or what it connects to (see
	// Mode): tcp://host:port, the host an IP address, a name, or * for
	// every interface; port 0 lets the system choose (see
	// [Publisher.Endpoint]). Required: there is no default, so that events
	// are never exposed beyond what was asked. As vLLM's, tcp://*:5557
	// binds and tcp://router-host:5557 connects (a subscriber binds there).
	Endpoint string `json:"endpoint"`
	// Mode is ModeAuto (vLLM's rule, for ""), ModeBind or ModeConnect. The
	// replay socket always binds.
	Mode Mode `json:"mode,omitempty"`
	// ReplayEndpoint is where the ROUTER socket that answers replay
	// requests binds, as Endpoint; "" for no replay.
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
	// LegacyReplay sends replay replies as vLLM did before 0.26, for
	// consumers older than vLLM 0.26: [seq, payload] per batch and
	// [-1, ""] at the end, without the topic frame that vLLM 0.26 and
	// llm-d-router 0.10 expect ([topic, seq, payload], ["", -1, ""]).
	LegacyReplay bool `json:"legacy_replay,omitempty"`
	// MaxPeers bounds the connections of each socket, handshakes in
	// progress included; a connection over it is closed at once and
	// counted ([Stats].PeersRefused). 0 is DefaultMaxPeers.
	MaxPeers int `json:"max_peers,omitempty"`
	// BufferSteps is how many of the latest batches replay can resend;
	// 0 is DefaultBufferSteps.
	BufferSteps int `json:"buffer_steps"`
	// HWM bounds, in messages, what waits to be sent to each subscriber
	// (and to each replay client): past it, messages are dropped for that
	// peer, as ZeroMQ's high-water mark does. 0 is DefaultHWM.
	HWM int `json:"hwm"`
	// MaxQueueSize bounds, in batches, what Publish has queued and the
	// sender has not yet sent; a batch published when it is full is
	// dropped and counted. 0 is DefaultMaxQueueSize.
	MaxQueueSize int `json:"max_queue_size"`
	// Topic is the first frame of every message (subscribers filter on its
	// prefix); llm-d reads topics of the form kv@<pod>@<model>. It is
	// UTF-8 of at most MaxTopicBytes bytes, without control characters
	// (NUL and newlines among them).
	Topic string `json:"topic"`
	// Medium is the medium of every event whose Event.Medium is "":
	// MediumCPU for memstore, MediumStorage or a name of the deployment's
	// choosing for Mooncake. Required.
	Medium string `json:"medium"`
	// DataParallelRank is the data-parallel rank sent with every batch.
	// (vLLM also adds it to the endpoints' ports; here each rank configures
	// its own endpoints.)
	DataParallelRank int `json:"data_parallel_rank"`
	// Format is FormatMap (the default, for "") or FormatArray.
	Format Format `json:"format,omitempty"`
	// CloseTimeout bounds how long Close sends what is queued; 0 is one
	// second, as vLLM's shutdown.
	CloseTimeout time.Duration `json:"-"`
	// Logger receives the publisher's warnings; nil discards them.
	Logger *slog.Logger `json:"-"`
}

// EnsureDefaults returns c with every zero field that has a default set to
// it.
func (c Config) EnsureDefaults() Config {
	if c.BufferSteps == 0 {
		c.BufferSteps = DefaultBufferSteps
	}
	if c.HWM == 0 {
		c.HWM = DefaultHWM
	}
	if c.MaxQueueSize == 0 {
		c.MaxQueueSize = DefaultMaxQueueSize
	}
	if c.Format == "" {
		c.Format = FormatMap
	}
	if c.MaxPeers == 0 {
		c.MaxPeers = DefaultMaxPeers
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = time.Second
	}
	return c
}

// Validate returns an error naming the first field of c (after
// EnsureDefaults) that is invalid, with its value.
func (c Config) Validate() error {
	c = c.EnsureDefaults()
	if c.Endpoint == "" {
		return fmt.Errorf("kvevents: endpoint = \"\": required, for example tcp://127.0.0.1:5557")
	}
	if _, err := zmtp.TCPAddr(c.Endpoint); err != nil {
		return fmt.Errorf("kvevents: endpoint = %q: want tcp://host:port", c.Endpoint)
	}
	if c.ReplayEndpoint != "" {
		if _, err := zmtp.TCPAddr(c.ReplayEndpoint); err != nil {
			return fmt.Errorf("kvevents: replay_endpoint = %q: want tcp://host:port or \"\"", c.ReplayEndpoint)
		}
		if c.ReplayEndpoint == c.Endpoint && !strings.HasSuffix(c.Endpoint, ":0") {
			return fmt.Errorf("kvevents: replay_endpoint = %q: the same as endpoint", c.ReplayEndpoint)
		}
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"buffer_steps", c.BufferSteps}, {"hwm", c.HWM}, {"max_queue_size", c.MaxQueueSize}, {"max_peers", c.MaxPeers}} {
		if f.v < 0 {
			return fmt.Errorf("kvevents: %s = %d: negative (0 is the default)", f.name, f.v)
		}
	}
	if c.Mode != ModeAuto && c.Mode != ModeBind && c.Mode != ModeConnect {
		return fmt.Errorf("kvevents: mode = %q: want \"\" (vLLM's rule), %q or %q", c.Mode, ModeBind, ModeConnect)
	}
	if !c.Binds() && strings.HasSuffix(c.Endpoint, ":0") {
		return fmt.Errorf("kvevents: endpoint = %q: port 0 with mode %q: there is nothing to connect to", c.Endpoint, c.Mode)
	}
	if err := checkTopic(c.Topic); err != nil {
		return err
	}
	if c.Medium == "" {
		return fmt.Errorf("kvevents: medium = \"\": required (%s for memstore, %s for Mooncake)", MediumCPU, MediumStorage)
	}
	if c.DataParallelRank < 0 {
		return fmt.Errorf("kvevents: data_parallel_rank = %d: negative", c.DataParallelRank)
	}
	if c.Format != FormatMap && c.Format != FormatArray {
		return fmt.Errorf("kvevents: format = %q: want %q or %q", c.Format, FormatMap, FormatArray)
	}
	if c.CloseTimeout < 0 {
		return fmt.Errorf("kvevents: CloseTimeout = %v: negative", c.CloseTimeout)
	}
	return nil
}

// Binds reports whether the PUB socket binds Endpoint, rather than
// connect to it, by Mode's rule.
func (c Config) Binds() bool {
	switch c.Mode {
	case ModeBind:
		return true
	case ModeConnect:
		return false
	}
	addr, err := zmtp.TCPAddr(c.Endpoint)
	if err != nil {
		return true
	}
	host, port, _ := net.SplitHostPort(addr)
	return host == "" || strings.Contains(host, "::") || port == "0"
}

// checkTopic returns an error naming the topic, quoted and truncated, when
// it is not UTF-8, holds a control character or is over MaxTopicBytes.
func checkTopic(topic string) error {
	bad := func(why string) error {
		q := strconv.Quote(topic)
		if len(topic) > 64 {
			q = strconv.Quote(topic[:64]) + fmt.Sprintf("... (%d bytes)", len(topic))
		}
		return fmt.Errorf("kvevents: topic = %s: %s", q, why)
	}
	if len(topic) > MaxTopicBytes {
		return bad(fmt.Sprintf("over %d bytes", MaxTopicBytes))
	}
	if !utf8.ValidString(topic) {
		return bad("not valid UTF-8")
	}
	for i, r := range topic {
		if r < 0x20 || r == 0x7f {
			return bad(fmt.Sprintf("control character %U at byte %d", r, i))
		}
	}
	return nil
}
