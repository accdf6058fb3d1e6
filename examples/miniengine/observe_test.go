package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector/kvevents"
)

// TestWaitIdleSteps: over a store that takes 2 ms a call, with lookups
// beside the engine, an engine that steps to poll steps idle while
// lookups and transfers run; waiting on the connector's wake-ups it steps
// only on news: at most one idle step per lookup and per transfer, and
// the outputs are the same.
func TestWaitIdleSteps(t *testing.T) {
	o := small(t)
	o.StoreLatency = 2 * time.Millisecond
	off := mustRun(t, o, false, o.PressureBlocks)
	o.Wait = false
	spin := mustRun(t, o, true, o.PressureBlocks)
	o.Wait = true
	waited := mustRun(t, o, true, o.PressureBlocks)
	mustSame(t, "stepping", off, spin)
	mustSame(t, "waiting", off, waited)
	reqs := float64(o.Workload.Sessions * o.Workload.Turns)
	t.Logf("idle steps per request: %.1f stepping, %.1f waiting (%d lookups, %d blocks loaded, %d saved)",
		float64(spin.IdleSteps)/reqs, float64(waited.IdleSteps)/reqs, waited.ConnLookups, waited.ConnLoads, waited.ConnSaves)
	// Each transfer moves at least one block, so blocks bound transfers.
	if bound := 2 * (waited.ConnLookups + waited.ConnLoads + waited.ConnSaves + 1); int64(waited.IdleSteps) > bound {
		t.Errorf("waiting: %d idle steps, want at most %d (two per lookup and per block transferred)", waited.IdleSteps, bound)
	}
}

// TestMetricsAndEvents: with -metrics and -kv-events the report is
// unchanged, /metrics serves the connector-on run, and the publisher
// announced the blocks the runs saved.
func TestMetricsAndEvents(t *testing.T) {
	o := small(t)
	o.Metrics = "127.0.0.1:0"
	o.KVEvents = "tcp://127.0.0.1:0"
	var out, errw bytes.Buffer
	var events kvevents.Stats
	o.events = &events
	scraped := make(chan string, 1)
	o.onRun = func(ob *observer) {
		// Scrape while the run's engines exist: its registry is served.
		resp, err := http.Get("http://" + ob.addr + "/metrics")
		if err != nil {
			scraped <- "GET: " + err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		select {
		case scraped <- string(b):
		default:
		}
	}
	if err := Main(context.Background(), o, &out, &errw); err != nil {
		t.Fatalf("Main: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "outputs identical: yes") {
		t.Fatalf("report:\n%s", out.String())
	}
	body := <-scraped
	for _, want := range []string{
		`kvconnect_connector_healthy{engine="0",rank="0",role="worker"} 1`,
		`kvconnect_store_operation_duration_seconds_bucket{operation="exists",status="ok",le="0.001"}`,
		`kvconnect_prompt_tokens_total{engine="0",source="local_compute"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q:\n%s", want, body)
		}
	}
	if events.Events == 0 || events.DroppedEvents != 0 {
		t.Errorf("KV events: %+v; want events published, none dropped", events)
	}
}

// BenchmarkObserveOverhead: the connector-on run without pressure, with
// the metrics (-metrics) and the KV events (-kv-events) on and off, in
// turn within each iteration (the order alternating, since a second run
// is often slower than a first), over the same workload: "on/off" is the
// ratio of their summed durations, the figure the target (within 1%)
// speaks of.
func BenchmarkObserveOverhead(b *testing.B) {
	o := defaultOptions()
	o.Workload.Sessions, o.Workload.Turns = 4, 2
	o.Progress = false
	if err := o.Validate(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var errw bytes.Buffer
	obs, err := newObserver("127.0.0.1:0", &errw)
	if err != nil {
		b.Fatal(err)
	}
	defer obs.Close()
	eo := o
	eo.KVEvents = "tcp://127.0.0.1:0"
	sink, err := newEventSink(ctx, eo, &errw)
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	on := o
	on.obs, on.sink = obs, sink
	var with, without time.Duration
	run := func(o Options) time.Duration {
		st, err := runOnce(ctx, o, true, o.Blocks, nil)
		if err != nil {
			b.Fatal(err)
		}
		return st.Duration
	}
	i := 0
	for b.Loop() {
		if i%2 == 0 {
			with += run(on)
			without += run(o)
		} else {
			without += run(o)
			with += run(on)
		}
		i++
	}
	b.ReportMetric(float64(with)/float64(without), "on/off")
	b.ReportMetric(float64(without.Milliseconds())/float64(i), "ms/run-off")
	b.ReportMetric(float64(with.Milliseconds())/float64(i), "ms/run-on")
	if st := sink.pub.Stats(); st.Events == 0 {
		b.Fatalf("no KV event was published: %+v", st)
	}
}
