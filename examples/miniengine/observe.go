package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/kvevents"
	"github.com/kvconnect/kvconnect/connector/prom"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/store"
)

// observer serves on -metrics the metrics of the latest run with the
// connector on: each such run gets a registry of its own (its engines'
// connector halves, its prompt tokens by source, its store), which the
// handler serves from the moment the run starts, and on through the
// connector-off runs after it; counters start at zero with each run.
type observer struct {
	srv  *http.Server
	addr string
	reg  atomic.Pointer[prometheus.Registry]
	done chan error
}

// newObserver listens on addr and serves /metrics until Close.
func newObserver(addr string, errw io.Writer) (*observer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-metrics %s: %w", addr, err)
	}
	ob := &observer{addr: ln.Addr().String(), done: make(chan error, 1)}
	ob.reg.Store(prometheus.NewRegistry())
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		promhttp.HandlerFor(ob.reg.Load(), promhttp.HandlerOpts{}).ServeHTTP(w, r)
	})
	ob.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { ob.done <- ob.srv.Serve(ln) }()
	fmt.Fprintf(errw, "metrics: http://%s/metrics\n", ob.addr)
	return ob, nil
}

// Close stops the server.
func (ob *observer) Close() error {
	if ob == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := ob.srv.Shutdown(ctx)
	if serr := <-ob.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// runMetrics are the collectors of one run.
type runMetrics struct {
	reg   *prometheus.Registry
	store prom.Instrumented
}

// newRun starts the registry of a run; nil without -metrics.
func (ob *observer) newRun() *runMetrics {
	if ob == nil {
		return nil
	}
	return &runMetrics{reg: prometheus.NewRegistry()}
}

// wrap instruments the run's store.
func (rm *runMetrics) wrap(st store.Store) store.Store {
	if rm == nil {
		return st
	}
	rm.store = prom.InstrumentStore(st, prom.Options{})
	rm.reg.MustRegister(rm.store, prom.NewStoreStats(st, prom.Options{}))
	return rm.store
}

// engine registers the collectors of the run's i'th engine and gives it
// what it refreshes and counts.
func (rm *runMetrics) engine(i int, e *Engine) {
	if rm == nil {
		return
	}
	opts := prom.Options{Labels: prometheus.Labels{"engine": strconv.Itoa(i)}}
	o := &engineMetrics{tokens: prom.NewPromptTokens(opts)}
	rm.reg.MustRegister(o.tokens)
	if e.conn != nil {
		o.sched = prom.NewScheduler(e.conn, opts)
		rm.reg.MustRegister(o.sched)
	}
	if e.worker != nil {
		rm.reg.MustRegister(prom.NewWorker(e.worker, 0, opts))
	}
	e.metrics = o
}

// serve makes the run's registry the one /metrics serves.
func (ob *observer) serve(rm *runMetrics) {
	if ob != nil && rm != nil {
		ob.reg.Store(rm.reg)
	}
}

// engineMetrics is what an engine updates as it steps.
type engineMetrics struct {
	sched  *prom.Scheduler // nil without a connector
	tokens *prom.PromptTokens
}

// eventSink publishes the KV events of the runs with the connector on
// (-kv-events), one batch per engine step, on vLLM's wire: medium "CPU"
// for the embedded store, "STORAGE" for Mooncake. A run's start is
// announced with AllBlocksCleared, as each run starts with a store of its
// own (or a tenant of its own).
type eventSink struct {
	pub *kvevents.Publisher
	buf []kvevents.Event
}

// newEventSink opens the publisher at o.KVEvents (bound or connected by
// vLLM's rule), and, when it binds, its replay socket at the next port.
func newEventSink(ctx context.Context, o Options, errw io.Writer) (*eventSink, error) {
	cfg := kvevents.Config{Endpoint: o.KVEvents, Medium: kvevents.MediumCPU, Topic: "kv@miniengine@kvconnect-mini"}
	if o.Store == "mooncake" {
		cfg.Medium = kvevents.MediumStorage
	}
	if replay, ok := nextPort(o.KVEvents); ok && cfg.Binds() {
		cfg.ReplayEndpoint = replay
	}
	pub, err := kvevents.Open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("-kv-events %s: %w", o.KVEvents, err)
	}
	fmt.Fprintf(errw, "KV events: %s (replay %s), topic %q\n", pub.Endpoint(), pub.ReplayEndpoint(), cfg.Topic)
	return &eventSink{pub: pub}, nil
}

// nextPort returns endpoint with its port plus one, for the replay
// socket; false for port 0 or an endpoint it cannot parse.
func nextPort(endpoint string) (string, bool) {
	host, port, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil || !strings.HasPrefix(endpoint, "tcp://") {
		return "", false
	}
	n, err := strconv.Atoi(port)
	if err != nil || n <= 0 || n >= 65535 {
		return "", false
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(n+1)), true
}

// engineEvents is one engine's view of the sink: its layout's groups.
type engineEvents struct {
	s      *eventSink
	bs     int
	groups []hashing.Group
}

// forEngine returns the sink of an engine of cfg, after announcing that
// the store it starts with holds nothing; nil without -kv-events.
func (s *eventSink) forEngine(cfg EngineConfig) *engineEvents {
	if s == nil {
		return nil
	}
	s.pub.Publish([]kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
	l := cfg.Identity.Layout
	return &engineEvents{s: s, bs: l.BlockSize, groups: l.EffectiveGroups()}
}

// publish sends the events of one step, if any.
func (e *engineEvents) publish(evs []connector.KVEvent) {
	if len(evs) == 0 {
		return
	}
	s := e.s
	s.buf = s.buf[:0]
	for _, ev := range evs {
		k := kvevents.FromConnector(ev, e.bs)
		if ev.Group >= 0 && ev.Group < len(e.groups) {
			switch g := e.groups[ev.Group]; g.Kind {
			case hashing.SlidingWindow:
				k.SpecKind, k.SlidingWindow = "sliding_window", g.Window
			case hashing.RecurrentState:
				k.SpecKind = "mamba"
			}
		}
		s.buf = append(s.buf, k)
	}
	// A batch that cannot be queued is counted by the publisher; the
	// engine never waits for a subscriber.
	s.pub.Publish(s.buf)
}

// Close sends what is queued, within the publisher's close timeout.
func (s *eventSink) Close() error {
	if s == nil {
		return nil
	}
	return s.pub.Close()
}
