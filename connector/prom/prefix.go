package prom

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// ExternalPrefixCache counts, in tokens, what an engine asked of its
// connector and what the connector's store had, as vLLM's
// vllm:external_prefix_cache_queries and vllm:external_prefix_cache_hits
// do:
//
//	kvconnect_external_prefix_cache_queries_tokens_total  prompt tokens of the requests looked up
//	kvconnect_external_prefix_cache_hits_tokens_total     of those, the tokens the connector matched
//
// so that the external hit rate computes as in vLLM's dashboards:
//
//	rate(kvconnect_external_prefix_cache_hits_tokens_total[5m])
//	  / rate(kvconnect_external_prefix_cache_queries_tokens_total[5m])
//
// The engine calls [ExternalPrefixCache.Record] once per request it
// admits (again when it resumes a preempted one), with the request's
// prompt tokens (vLLM's request.num_tokens) and the tokens the
// connector's Match answered (vLLM's num_external_computed_tokens), as
// vLLM's scheduler does. A pending Match is recorded once it answered.
//
// An ExternalPrefixCache is a [prometheus.Collector], safe for
// concurrent use; Record allocates nothing.
type ExternalPrefixCache struct {
	queries, hits prometheus.Counter
}

var _ prometheus.Collector = (*ExternalPrefixCache)(nil)

// NewExternalPrefixCache returns the counters, whose metrics carry the
// labels of opts, both exported from the start at zero. It panics if
// opts.Labels names a label the package sets (see [Options]).
func NewExternalPrefixCache(opts Options) *ExternalPrefixCache {
	labels := opts.labels(nil)
	return &ExternalPrefixCache{
		queries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace:   namespace,
			Name:        "external_prefix_cache_queries_tokens_total",
			Help:        "Prompt tokens of the requests looked up in the connector's store (vLLM's external_prefix_cache_queries).",
			ConstLabels: labels,
		}),
		hits: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace:   namespace,
			Name:        "external_prefix_cache_hits_tokens_total",
			Help:        "Tokens of those lookups that the connector matched (vLLM's external_prefix_cache_hits).",
			ConstLabels: labels,
		}),
	}
}

// Record counts a request of prompt tokens of which the connector matched
// hits. It panics if hits is negative or more than prompt: a programming
// error.
func (c *ExternalPrefixCache) Record(prompt, hits int) {
	if hits < 0 || hits > prompt {
		panic(fmt.Sprintf("prom: ExternalPrefixCache.Record(%d, %d): want 0 <= hits <= prompt", prompt, hits))
	}
	c.queries.Add(float64(prompt))
	c.hits.Add(float64(hits))
}

// Describe implements [prometheus.Collector].
func (c *ExternalPrefixCache) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.queries.Desc()
	ch <- c.hits.Desc()
}

// Collect implements [prometheus.Collector].
func (c *ExternalPrefixCache) Collect(ch chan<- prometheus.Metric) {
	ch <- c.queries
	ch <- c.hits
}
