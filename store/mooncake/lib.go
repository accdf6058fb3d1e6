package mooncake

// api is the C API of libmooncake_store.so (mooncake-store/include/store_c.h),
// one field per function. Every pointer argument is an address of memory
// outside the Go heap (see arena); size_t is uintptr, int is int32.
type api struct {
	// mooncake_store_t mooncake_store_create(void);
	create func() uintptr
	// void mooncake_store_destroy(mooncake_store_t store);
	destroy func(store uintptr)
	// int mooncake_store_setup(mooncake_store_t store, const char *local_hostname,
	//     const char *metadata_server, uint64_t global_segment_size,
	//     uint64_t local_buffer_size, const char *protocol,
	//     const char *device_name, const char *master_server_addr);
	setup func(store, localHostname, metadataServer uintptr, globalSegmentSize, localBufferSize uint64, protocol, deviceName, masterServerAddr uintptr) int32
	// int mooncake_store_init_all(mooncake_store_t store, const char *protocol,
	//     const char *device_name, uint64_t mount_segment_size);
	initAll func(store, protocol, deviceName uintptr, mountSegmentSize uint64) int32
	// int mooncake_store_health_check(mooncake_store_t store);
	healthCheck func(store uintptr) int32
	// int mooncake_store_put(mooncake_store_t store, const char *key,
	//     const void *value, size_t size, const mooncake_replicate_config_t *config);
	put func(store, key, value, size, config uintptr) int32
	// int mooncake_store_put_from(mooncake_store_t store, const char *key,
	//     void *buffer, size_t size, const mooncake_replicate_config_t *config);
	putFrom func(store, key, buffer, size, config uintptr) int32
	// int mooncake_store_batch_put_from(mooncake_store_t store, const char **keys,
	//     void **buffers, const size_t *sizes, size_t count,
	//     const mooncake_replicate_config_t *config, int *results_out);
	batchPutFrom func(store, keys, buffers, sizes, count, config, resultsOut uintptr) int32
	// int64_t mooncake_store_get_into(mooncake_store_t store, const char *key,
	//     void *buffer, size_t size);
	getInto func(store, key, buffer, size uintptr) int64
	// int mooncake_store_batch_get_into(mooncake_store_t store, const char **keys,
	//     void **buffers, const size_t *sizes, size_t count, int64_t *results_out);
	batchGetInto func(store, keys, buffers, sizes, count, resultsOut uintptr) int32
	// int mooncake_store_is_exist(mooncake_store_t store, const char *key);
	isExist func(store, key uintptr) int32
	// int mooncake_store_batch_is_exist(mooncake_store_t store, const char **keys,
	//     size_t count, int *results_out);
	batchIsExist func(store, keys, count, resultsOut uintptr) int32
	// int64_t mooncake_store_get_size(mooncake_store_t store, const char *key);
	getSize func(store, key uintptr) int64
	// int mooncake_store_get_hostname(mooncake_store_t store, char *buf_out, size_t buf_len);
	getHostname func(store, bufOut, bufLen uintptr) int32
	// int mooncake_store_remove(mooncake_store_t store, const char *key, int force);
	remove func(store, key uintptr, force int32) int32
	// int64_t mooncake_store_remove_by_regex(mooncake_store_t store, const char *pattern, int force);
	removeByRegex func(store, pattern uintptr, force int32) int64
	// int64_t mooncake_store_remove_all(mooncake_store_t store, int force);
	removeAll func(store uintptr, force int32) int64
	// int mooncake_store_register_buffer(mooncake_store_t store, void *buffer, size_t size);
	registerBuffer func(store, buffer, size uintptr) int32
	// int mooncake_store_unregister_buffer(mooncake_store_t store, void *buffer);
	unregisterBuffer func(store, buffer uintptr) int32
}

// symbols pairs each C name with its field of a.
func (a *api) symbols() []struct {
	name string
	fn   any
} {
	return []struct {
		name string
		fn   any
	}{
		{"mooncake_store_create", &a.create},
		{"mooncake_store_destroy", &a.destroy},
		{"mooncake_store_setup", &a.setup},
		{"mooncake_store_init_all", &a.initAll},
		{"mooncake_store_health_check", &a.healthCheck},
		{"mooncake_store_put", &a.put},
		{"mooncake_store_put_from", &a.putFrom},
		{"mooncake_store_batch_put_from", &a.batchPutFrom},
		{"mooncake_store_get_into", &a.getInto},
		{"mooncake_store_batch_get_into", &a.batchGetInto},
		{"mooncake_store_is_exist", &a.isExist},
		{"mooncake_store_batch_is_exist", &a.batchIsExist},
		{"mooncake_store_get_size", &a.getSize},
		{"mooncake_store_get_hostname", &a.getHostname},
		{"mooncake_store_remove", &a.remove},
		{"mooncake_store_remove_by_regex", &a.removeByRegex},
		{"mooncake_store_remove_all", &a.removeAll},
		{"mooncake_store_register_buffer", &a.registerBuffer},
		{"mooncake_store_unregister_buffer", &a.unregisterBuffer},
	}
}

// The replication config passed to puts (struct mooncake_replicate_config).
// Mooncake has shipped two layouts with the same name and no version
// symbol to tell them apart:
//
//	offset  store_c.h of 2026-04 to 08      later store_c.h
//	0       size_t replica_num              size_t replica_num
//	8       int with_soft_pin               int with_hard_pin
//	12      int with_hard_pin               (padding)
//	16      const char **preferred_segments const char **preferred_segments
//	24      size_t preferred_segments_count size_t preferred_segments_count
//	32      -                               int soft_pin_action
//	36      -                               int has_soft_pin_ttl
//	40      -                               uint64_t soft_pin_ttl_ms
//
// The binding sets only the fields both layouts place alike (replica_num,
// preferred_segments, their count) and writes replicateSize zeroed bytes,
// which every layout reads as "no pins". With neither field set it passes
// NULL (the master's defaults).
const (
	replicateSize          = 48
	replicateOffReplicaNum = 0
	replicateOffPreferred  = 16
	replicateOffPreferredN = 24
)
