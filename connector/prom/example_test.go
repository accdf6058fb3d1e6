package prom_test

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/kvconnect/kvconnect/connector/prom"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// Example registers an instrumented store, its Stats and an engine's
// prompt-token counts on one registry, makes a few calls, and prints
// some lines of the scrape.
func Example() {
	mem, err := memstore.New(memstore.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	labels := prometheus.Labels{"engine": "e1"}
	s := prom.InstrumentStore(mem, prom.Options{Labels: labels}) // hand s to the connector (connector.Env.Store)
	defer s.Close()
	tokens := prom.NewPromptTokens(prom.Options{Labels: labels})

	reg := prometheus.NewRegistry()
	reg.MustRegister(s, prom.NewStoreStats(mem, prom.Options{Labels: labels}), tokens)
	// Serve it: http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	// A save of two 4 KiB blocks, a load that finds one of three.
	host, err := rdma.AllocHost(3 * 4096)
	if err != nil {
		log.Fatal(err)
	}
	defer host.Free()
	r := make([]rdma.Region, 3)
	for i := range r {
		r[i], _ = host.Region().Sub(i*4096, 4096)
	}
	ctx := context.Background()
	res := make([]store.Result, 3)
	if err := s.Put(ctx, []string{"t@ns@0@a", "t@ns@0@b"}, r[:2], res[:2]); err != nil {
		log.Fatal(err)
	}
	if err := s.Get(ctx, []string{"t@ns@0@a", "t@ns@0@x", "t@ns@0@y"}, r, res); err != nil {
		log.Fatal(err)
	}
	tokens.Add(prom.ExternalTransfer, 16)
	tokens.Add(prom.LocalCompute, 33)

	mfs, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "kvconnect_store_operation_keys_total", "kvconnect_store_operation_bytes_total",
			"kvconnect_store_stored_bytes", "kvconnect_prompt_tokens_total":
		case "kvconnect_store_operation_duration_seconds":
			for _, m := range mf.GetMetric() {
				if m.GetHistogram().GetSampleCount() > 0 {
					fmt.Printf("%s_count%s %d\n", mf.GetName(), labelText(m.GetLabel()), m.GetHistogram().GetSampleCount())
				}
			}
			continue
		default:
			continue
		}
		var b strings.Builder
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			log.Fatal(err)
		}
		for line := range strings.Lines(b.String()) {
			if !strings.HasPrefix(line, "#") && !strings.Contains(line, `status="ok"} 0`) {
				fmt.Print(line)
			}
		}
	}
	// Output:
	// kvconnect_prompt_tokens_total{engine="e1",source="external_kv_transfer"} 16
	// kvconnect_prompt_tokens_total{engine="e1",source="local_cache_hit"} 0
	// kvconnect_prompt_tokens_total{engine="e1",source="local_compute"} 33
	// kvconnect_store_operation_bytes_total{engine="e1",operation="get"} 4096
	// kvconnect_store_operation_bytes_total{engine="e1",operation="put"} 8192
	// kvconnect_store_operation_duration_seconds_count{engine="e1",operation="get",status="ok"} 1
	// kvconnect_store_operation_duration_seconds_count{engine="e1",operation="put",status="ok"} 1
	// kvconnect_store_operation_keys_total{engine="e1",operation="get",status="not_found"} 2
	// kvconnect_store_operation_keys_total{engine="e1",operation="get",status="ok"} 1
	// kvconnect_store_operation_keys_total{engine="e1",operation="put",status="ok"} 2
	// kvconnect_store_stored_bytes{engine="e1"} 8192
}

// labelText writes label pairs as the text format does.
func labelText(pairs []*dto.LabelPair) string {
	var parts []string
	for _, p := range pairs {
		parts = append(parts, fmt.Sprintf("%s=%q", p.GetName(), p.GetValue()))
	}
	return "{" + strings.Join(parts, ",") + "}"
}
