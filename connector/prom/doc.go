// Package prom exports kvconnect's metrics to Prometheus: the counters
// and health of a connector's two halves, a store's own counters and what
// it holds, the latency and outcome of every call to a store, and an
// engine's prompt tokens by where their KV came from.
//
// It is for engines and operators. It is a package of its own, which no
// package of kvconnect imports, so that the core (connector, scheduler,
// store, hashing, rdma) stays free of dependencies: only a program that
// imports prom links github.com/prometheus/client_golang, the Prometheus
// project's own Go client, which every Go exporter uses and whose
// registry checks what this package exports (consistent names, labels
// and help, no duplicate series).
//
// # Usage
//
// Build the collectors once, at start-up, next to the connector they
// watch, and register them on the engine's registry:
//
//	st := prom.InstrumentStore(mem, prom.Options{})  // times every call to the store
//	env := connector.Env{Store: st, ...}             // the connector calls the store through it
//	sched, _ := connector.OpenPlanner(cfg, env)
//	sc := prom.NewScheduler(sched, prom.Options{})
//	reg.MustRegister(st, prom.NewStoreStats(mem, prom.Options{}), sc)
//	for rank, w := range workers {
//		reg.MustRegister(prom.NewWorker(w, rank, prom.Options{}))
//	}
//	tokens := prom.NewPromptTokens(prom.Options{})
//	prefix := prom.NewExternalPrefixCache(prom.Options{})
//	if err := prom.Register(reg, tokens, prefix); err != nil { ... }
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// and in the scheduling loop, on the goroutine that drives the scheduler
// half (its Stats may be called from there only):
//
//	sc.Refresh()                                  // once a step
//	tokens.Add(prom.LocalCacheHit, localHit)      // as requests are admitted
//	tokens.Add(prom.ExternalTransfer, external)
//	tokens.Add(prom.LocalCompute, computed)
//	prefix.Record(r.Prompt, m.Tokens)             // once Match answered, as a request is admitted
//
// Counters kept by kvconnect (connector.Stats, connector.Health,
// store.Stats) are read at scrape time, or for the scheduler half at the
// latest Refresh, and exported as they are: a collector never keeps a
// count of its own of them, so nothing is counted twice, and between
// scrapes they cost the engine nothing. Only the instrumented store
// and PromptTokens count, on the calls they see.
//
// # Metrics
//
// Every name starts with kvconnect_. Counters end in _total, times are in
// seconds and sizes in bytes. Every metric also carries the constant
// labels of its collector's [Options]: fixed at construction, never a
// request, a key, a token or a tenant. Health.LastError's text names keys
// and is in no label; its time is.
//
// A connector half, from [NewScheduler] and [NewWorker], labelled
// role="scheduler" (and rank="", which Prometheus stores as no label) or
// role="worker" and rank="<tensor-parallel rank>". From connector.Stats,
// when the half implements [connector.StatsReporter]:
//
//	kvconnect_connector_lookups_total                     exists probes started (Lookups)
//	kvconnect_connector_lookup_keys_total                 keys probed (LookupKeys)
//	kvconnect_connector_hit_blocks_total                  blocks matched from the store (HitBlocks)
//	kvconnect_connector_hit_tokens_total                  tokens matched from the store (HitTokens)
//	kvconnect_connector_blocks_total{operation,status}    blocks moved: load ok (Loads), load failed
//	                                                      (LoadFailures), save ok (Saves), save failed
//	                                                      (SaveFailures), save skipped (SaveSkipped: the
//	                                                      store had them)
//	kvconnect_connector_bytes_total{operation}            bytes moved: load (LoadBytes), save (SaveBytes)
//	kvconnect_connector_corrupt_blocks_total              loaded blocks that failed verification (Corrupt;
//	                                                      also in blocks_total load failed)
//	kvconnect_connector_store_failures_total{reason}      store calls that failed: reason="timeout"
//	                                                      (StoreTimeouts), reason="error" (the others:
//	                                                      StoreErrors - StoreTimeouts); their sum is StoreErrors
//	kvconnect_connector_save_retries_total                blocks requeued after an out-of-space put (SaveRetries)
//	kvconnect_connector_staged_bytes_total                bytes copied through a staging buffer (StagedBytes)
//	kvconnect_connector_stale_discarded_total             transfers of an old generation dropped (StaleDiscarded)
//	kvconnect_connector_failed_skipped_blocks_total       blocks found but not matched: their load failed
//	                                                      lately (FailedSkipped)
//	kvconnect_connector_slow_skipped_blocks_total         blocks found but not matched: loads (from the
//	                                                      tier holding them) ran slower than prefill
//	                                                      (SlowSkipped)
//	kvconnect_connector_load_tokens_total{medium}         tokens of the blocks loaded, by the medium of the
//	                                                      store tier that served them: CPU, DISK, STORAGE,
//	                                                      other (LoadTokensCPU, LoadTokensDisk,
//	                                                      LoadTokensStorage, LoadTokensOther; a worker's,
//	                                                      over a store.Layered store such as store/tiered;
//	                                                      zero otherwise)
//	kvconnect_connector_refused_params_total              transfer parameters refused: malformed, of another
//	                                                      identity, forged, or unverifiable (Refused)
//	kvconnect_connector_event_resyncs_total               AllCleared events announced because the store's
//	                                                      feed of key events lost events (Resyncs)
//	kvconnect_connector_lookup_seconds_total              time in lookups (LookupNanos)
//	kvconnect_connector_transfer_seconds_total            time in loads and saves (TransferNanos)
//
// What a field counts in each half is what connector.Stats says (the
// scheduler half's LoadFailures, say, are the blocks a failed load
// discarded). From connector.Health, when the half implements
// [connector.HealthReporter]:
//
//	kvconnect_connector_healthy                           1 while the latest call succeeded, else 0
//	kvconnect_connector_consecutive_failures              calls failed since the last success (gauge)
//	kvconnect_connector_failed_calls_total                calls failed, ever (Failures)
//	kvconnect_connector_last_failure_timestamp_seconds    when the latest failed; absent before one
//
// A store's own counters, from [NewStoreStats] (store.Stats; what it
// counted of every caller of a shared store):
//
//	kvconnect_store_stored_keys                           keys held (Keys, gauge)
//	kvconnect_store_stored_bytes                          value bytes held (Bytes, gauge)
//	kvconnect_store_capacity_bytes                        value bytes it may hold (Capacity; absent if 0)
//	kvconnect_store_get_keys_total{result}                hit (Hits), miss (Misses)
//	kvconnect_store_exists_keys_total                     keys probed (Exists)
//	kvconnect_store_put_keys_total{result}                stored (Puts), duplicate (Duplicates),
//	                                                      rejected for lack of space (RejectedPuts)
//	kvconnect_store_evictions_total                       keys evicted (Evictions)
//	kvconnect_store_copied_bytes_total{direction}         in (BytesIn), out (BytesOut)
//
// The calls made through a store from [InstrumentStore], as vLLM's
// Mooncake connector exports them (vllm:mooncake_store_operation_*):
//
//	kvconnect_store_operation_duration_seconds{operation,status}  histogram of call times, buckets
//	                                                      exactly vLLM's (0.001, 0.005, 0.01, 0.05, 0.1,
//	                                                      0.2, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 4 s);
//	                                                      its _count counts calls
//	kvconnect_store_operation_keys_total{operation,status}        keys named, by each key's status
//	kvconnect_store_operation_bytes_total{operation}              value bytes of the keys that succeeded:
//	                                                      put (offered, present keys included), get (read)
//
// operation is exists, put (Put and PutV), get (Get and GetV), remove,
// remove_prefix or remove_all (keys_total counts the keys they removed).
// status is the call's outcome for the histogram (a batch call that
// returned nil is ok, whatever its keys did) and each key's for
// keys_total; a key of a call that failed whole gets the call's status.
// It comes from the store's sentinel errors and the context's:
// ok, not_found, no_space, lease_expired, has_lease, buffer_too_small,
// invalid_key, invalid_region, transfer, closed, unavailable, timeout
// (context.DeadlineExceeded, whatever the store wrapped it in), canceled,
// or error (anything else). A series of an operation whose status never
// happened is not exported; every operation's ok series are, from the
// start.
//
// An engine's prompt tokens, from [NewPromptTokens], as vLLM's
// vllm:prompt_tokens_by_source:
//
//	kvconnect_prompt_tokens_total{source}                 local_compute, local_cache_hit,
//	                                                      external_kv_transfer
//
// The connector's external prefix cache, in tokens, from
// [NewExternalPrefixCache], as vLLM's vllm:external_prefix_cache_queries
// and vllm:external_prefix_cache_hits (the engine records each request):
//
//	kvconnect_external_prefix_cache_queries_tokens_total  prompt tokens of the requests looked up
//	kvconnect_external_prefix_cache_hits_tokens_total     of those, the tokens the connector matched
//
// # Dashboard
//
// dashboard.json in this directory is a Grafana dashboard of these
// metrics (import it, pick the Prometheus data source): store call rates
// and latency quantiles, external prefix-cache hit rate, prompt tokens by
// source, blocks moved, failures and health. TestDashboardNamesExist
// checks that every metric its queries name is exported.
//
// # Registration
//
// [Register] registers collectors all or none and, when the registry
// refuses one (two collectors of the same metrics and labels: two stores
// or engines without a label of Options that tells them apart, a rank
// registered twice), returns an error naming the metric and its labels,
// where client_golang says only "duplicate metrics collector registration
// attempted".
//
// # Ranks
//
// Workers are not summed by the package: each worker's collector carries
// its rank, one series per rank, and an engine with tensor-parallel
// workers registers one [Worker] per rank on the same registry (a rank
// registered twice is refused by the registry). A dashboard sums them in
// the query, and still sees a rank that alone fails or is unhealthy:
//
//	sum without (rank) (rate(kvconnect_connector_blocks_total{role="worker"}[5m]))
//	min by (role) (kvconnect_connector_healthy)
//
// An engine that runs one process per rank registers that rank's Worker
// in each; the series are the same. Summed over ranks, blocks_total
// counts block shards (each rank moves its own shard of every block),
// bytes_total every byte moved, and load_tokens_total each token once per
// rank: take one rank's, or divide by the TP size, for tokens.
//
// # Concurrency
//
// Every collector is safe for concurrent use, and scrapes may run at any
// time. The instrumented store is safe for concurrent use as the store it
// wraps is; recording a call takes no lock and allocates nothing (each
// series is made at construction). [Scheduler.Refresh] is called from the
// engine's scheduling goroutine; [PromptTokens.Add] from any.
package prom
