package storeconn

import (
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/store"
)

// Name is the name the connector registers under, for kv_connector.
const Name = "StoreConnector"

// DefaultWatchBuffer is the default of watch_buffer: the key events of a
// store.Watcher that the scheduler half holds between two steps.
const DefaultWatchBuffer = 1 << 16

// DefaultEventBuffer is the default of event_buffer: the KV events the
// scheduler half holds for TakeEvents. Past it they are dropped and
// replaced by one AllCleared (Stats.Resyncs), so an engine that never
// takes them holds a bounded number.
const DefaultEventBuffer = 1 << 16

// options are the connector's settings, read from kv_connector_extra_config.
type options struct {
	syncLookup     bool          // "lookup": "sync" runs exists probes inside Match
	lookupWorkers  int           // "lookup_workers": goroutines probing the store
	lookupQueue    int           // "lookup_queue": lookups waiting for a worker
	transferWorker int           // "transfer_workers": worker goroutines moving blocks
	batchBlocks    int           // "batch_blocks": blocks per store call
	saveRetries    int           // "save_retries": out-of-space retries of a block
	retryDelay     int           // "retry_steps": steps between retries
	pollInterval   time.Duration // "event_poll": how often a worker polls a ready event
	verify         verifyMode    // "verify": "checksum" (the default), "mac" or "none"
	secret         secret        // "verify_key", or the environment's VerifyKeyEnv: the MAC key of verify "mac"
	storeTimeout   time.Duration // "store_timeout": the deadline of every store call
	failedTTL      time.Duration // "failed_ttl": how long a block whose load failed is not planned again
	verifyChunk    int           // "verify_chunk": bytes per verified load call over a gathering store; 0: batch_blocks
	layerChunks    int           // "layer_chunks": values per block, each a range of its layers, for layer-wise transfers
	watchBuffer    int           // "watch_buffer": key events of a store.Watcher held between two steps
	eventBuffer    int           // "event_buffer": KV events held for TakeEvents
	prefillRate    int           // "prefill_tokens_per_s": the engine's prefill speed; 0: every block found counts
}

// open checks what both halves need: the options, a store, and a valid
// identity, whose namespace it returns with the logger to use.
func open(cfg connector.Config, env connector.Env) (options, hashing.Namespace, *slog.Logger, error) {
	opt, err := parseOptions(cfg)
	if err != nil {
		return opt, hashing.Namespace{}, nil, err
	}
	if env.Store == nil {
		return opt, hashing.Namespace{}, nil, fmt.Errorf("%w: %s needs Env.Store (an open store.Store)", connector.ErrConfig, Name)
	}
	ns, err := env.Identity.Namespace()
	if err != nil {
		return opt, ns, nil, fmt.Errorf("storeconn: identity: %w", err)
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return opt, ns, log, nil
}

// extraKeys are the kv_connector_extra_config keys the connector reads;
// any other key is an error.
var extraKeys = []string{
	"batch_blocks", "event_buffer", "event_poll", "failed_ttl", "layer_chunks", "lookup", "lookup_queue", "lookup_workers",
	"prefill_tokens_per_s", "retry_steps", "save_retries", "store_timeout", "transfer_workers", "verify", "verify_chunk", "verify_key", "watch_buffer",
}

func parseOptions(cfg connector.Config) (options, error) {
	o := options{}
	if err := cfg.CheckExtra(extraKeys...); err != nil {
		return o, err
	}
	mode, err := cfg.ExtraChoice("lookup", "async", "async", "sync")
	if err != nil {
		return o, err
	}
	o.syncLookup = mode == "sync"
	v, err := cfg.ExtraChoice("verify", "checksum", "checksum", "mac", "none")
	if err != nil {
		return o, err
	}
	o.verify = map[string]verifyMode{"none": verifyNone, "checksum": verifyChecksum, "mac": verifyMAC}[v]
	if o.secret, err = parseVerifyKey(cfg, o.verify); err != nil {
		return o, err
	}
	// Every count has an upper bound too: each is a number of goroutines,
	// queue slots, store calls or blocks the connector holds or makes, and
	// a value far beyond any useful one (1e9 workers) would take the
	// process's memory rather than fail.
	ints := []struct {
		key           string
		dst           *int
		def, min, max int
	}{
		{"lookup_workers", &o.lookupWorkers, 2, 1, 256},
		{"lookup_queue", &o.lookupQueue, 256, 1, 1 << 16},
		{"transfer_workers", &o.transferWorker, 2, 1, 256},
		{"batch_blocks", &o.batchBlocks, 64, 1, 1 << 16},
		{"save_retries", &o.saveRetries, 3, 0, 100},
		{"retry_steps", &o.retryDelay, 1, 1, 1 << 20},
		{"verify_chunk", &o.verifyChunk, 1 << 20, 0, 1 << 30},
		{"layer_chunks", &o.layerChunks, 1, 1, 1 << 10},
		{"watch_buffer", &o.watchBuffer, DefaultWatchBuffer, 1, store.MaxWatch},
		{"event_buffer", &o.eventBuffer, DefaultEventBuffer, 1, 1 << 24},
		{"prefill_tokens_per_s", &o.prefillRate, 0, 0, math.MaxInt}, // a speed, not a count of anything held
	}
	for _, f := range ints {
		v, err := cfg.ExtraInt(f.key, f.def)
		if err != nil {
			return o, err
		}
		if v < f.min || v > f.max {
			return o, fmt.Errorf("%w: kv_connector_extra_config.%s = %d, want %d to %d", connector.ErrConfig, f.key, v, f.min, f.max)
		}
		*f.dst = v
	}
	durations := []struct {
		key      string
		dst      *time.Duration
		def      time.Duration
		min, max time.Duration // min 0: > 0 unless zero is allowed
		zero     bool
	}{
		{"event_poll", &o.pollInterval, 50 * time.Microsecond, 0, time.Second, false},
		{"store_timeout", &o.storeTimeout, 5 * time.Second, 0, 24 * time.Hour, false},
		{"failed_ttl", &o.failedTTL, 15 * time.Second, 0, 24 * time.Hour, true},
	}
	for _, f := range durations {
		v, err := cfg.ExtraDuration(f.key, f.def)
		if err != nil {
			return o, err
		}
		switch {
		case v < 0 || v == 0 && !f.zero:
			want := "> 0"
			if f.zero {
				want = ">= 0"
			}
			return o, fmt.Errorf("%w: kv_connector_extra_config.%s = %v, want %s", connector.ErrConfig, f.key, v, want)
		case v > f.max:
			return o, fmt.Errorf("%w: kv_connector_extra_config.%s = %v, want at most %v", connector.ErrConfig, f.key, v, f.max)
		}
		*f.dst = v
	}
	return o, nil
}

// verifyMode is what a value's trailer proves (kv_connector_extra_config
// "verify").
type verifyMode int

const (
	verifyNone     verifyMode = iota // "none": raw blocks, no trailer
	verifyChecksum                   // "checksum": CRC-32 and key digest, against accidents
	verifyMAC                        // "mac": keyed BLAKE3, against writers without the secret
)

// trailerBytes is the size of the mode's trailer.
func (m verifyMode) trailerBytes() int {
	switch m {
	case verifyChecksum:
		return trailerLen
	case verifyMAC:
		return macTrailerLen
	}
	return 0
}

// parseVerifyKey returns the secret of verify "mac": kv_connector_extra_config
// "verify_key", else the environment's VerifyKeyEnv. A "verify_key" with
// another mode is an error (a config that believes it authenticates
// values and does not). No error carries the key's text.
func parseVerifyKey(cfg connector.Config, mode verifyMode) (secret, error) {
	v, inConfig := cfg.Extra["verify_key"]
	switch {
	case inConfig && mode != verifyMAC:
		return secret{}, fmt.Errorf("%w: kv_connector_extra_config.verify_key is set, but verify is not \"mac\": the key would not be used", connector.ErrConfig)
	case mode != verifyMAC:
		return secret{}, nil
	case inConfig:
		text, ok := v.(string)
		if !ok {
			return secret{}, fmt.Errorf("%w: kv_connector_extra_config.verify_key is a %T, want a string of 64 hex digits (32 bytes)", connector.ErrConfig, v)
		}
		s, err := parseSecret(text, "kv_connector_extra_config.verify_key")
		if err != nil {
			return secret{}, fmt.Errorf("%w: %w", connector.ErrConfig, err)
		}
		return s, nil
	}
	s, ok, err := secretFromEnv()
	switch {
	case err != nil:
		return secret{}, fmt.Errorf("%w: %w", connector.ErrConfig, err)
	case !ok:
		return secret{}, fmt.Errorf("%w: kv_connector_extra_config.verify = \"mac\" needs the tenant's secret: kv_connector_extra_config.verify_key or the environment variable %s, 64 hex digits (32 bytes)", connector.ErrConfig, VerifyKeyEnv)
	}
	return s, nil
}
