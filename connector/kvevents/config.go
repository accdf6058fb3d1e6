package kvevents

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kvconnect/kvconnect/connector/kvevents/internal/zmtp"
)

// Defaults of [Config], vLLM's KVEventsConfig defaults.
const (
	DefaultBufferSteps  = 10000
	DefaultHWM          = 100000
	DefaultMaxQueueSize = 100000
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
	// Endpoint is where the PUB socket binds: tcp://host:port, the host an
	// IP address, a name, or * for every interface; port 0 lets the system
	// choose (see [Publisher.Endpoint]). Required: there is no default, so
	// that events are never exposed beyond what was asked, for example
	// tcp://127.0.0.1:5557 for this host only. Unlike vLLM, which connects
	// to an endpoint without a wildcard, the publisher always binds.
	Endpoint string `json:"endpoint"`
	// ReplayEndpoint is where the ROUTER socket that answers replay
	// requests binds, as Endpoint; "" for no replay.
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
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
	// prefix); llm-d reads topics of the form kv@<pod>@<model>.
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
	}{{"buffer_steps", c.BufferSteps}, {"hwm", c.HWM}, {"max_queue_size", c.MaxQueueSize}} {
		if f.v < 0 {
			return fmt.Errorf("kvevents: %s = %d: negative (0 is the default)", f.name, f.v)
		}
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
