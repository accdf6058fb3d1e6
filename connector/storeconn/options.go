package storeconn

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// Name is the name the connector registers under, for kv_connector.
const Name = "StoreConnector"

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
	verify         bool          // "verify": "checksum" (the default) or "none"
	storeTimeout   time.Duration // "store_timeout": the deadline of every store call
	failedTTL      time.Duration // "failed_ttl": how long a block whose load failed is not planned again
	verifyChunk    int           // "verify_chunk": bytes per verified load call over a gathering store; 0: batch_blocks
	layerChunks    int           // "layer_chunks": values per block, each a range of its layers, for layer-wise transfers
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
	"batch_blocks", "event_poll", "failed_ttl", "layer_chunks", "lookup", "lookup_queue", "lookup_workers",
	"retry_steps", "save_retries", "store_timeout", "transfer_workers", "verify", "verify_chunk",
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
	v, err := cfg.ExtraChoice("verify", "checksum", "checksum", "none")
	if err != nil {
		return o, err
	}
	o.verify = v == "checksum"
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
