// Package kvevents publishes a Go engine's KV cache events on vLLM's wire,
// so that KV-aware routers and dashboards written for vLLM (llm-d's KV
// cache indexer, Dynamo, AIBrix and others) see kvconnect engines as they
// see vLLM ones.
//
// It is for engines and connectors that want their store's contents
// visible to a router; kvconnect's core packages never import it.
//
// # The wire
//
// A ZeroMQ PUB socket (ZMTP 3.0, NULL security) sends one multipart
// message per batch (one engine step):
//
//	[topic, seq, payload]
//
// topic is [Config.Topic]; seq numbers the batches from 0, 8 bytes
// big-endian; payload is msgpack of vLLM's EventBatch, the array
// [ts float64, events, data_parallel_rank int]. Each event is one of vLLM's
// classes BlockStored, BlockRemoved and AllBlocksCleared: a map whose
// "type" is the class name and whose keys are the field names
// ([FormatMap], vLLM since 2026-06), or for older consumers an array with
// the class name first and the fields in order ([FormatArray], msgspec's
// array_like). BlockStored carries block_hashes, parent_block_hash,
// token_ids, block_size, lora_id (always null), medium, lora_name,
// extra_keys, group_idx, kv_cache_spec_kind and, for a sliding window,
// kv_cache_spec_sliding_window; BlockRemoved carries block_hashes, medium
// and group_idx. A block hash is the integer [hashing.BlockHash.Uint64]:
// its last 8 bytes, big-endian (hashing/SPEC.md, section 11).
//
// With [Config.ReplayEndpoint] set, a ROUTER socket resends the latest
// [Config.BufferSteps] batches: a DEALER client sends ["", start], start
// the first wanted seq as 8 bytes big-endian, and receives
// ["", seq, payload] for each buffered batch from start on, then
// ["", -1 as 8 bytes, ""] (the frames of vLLM's replay; a replay reply has
// no topic frame). A REQ client may send [start], as its socket adds the
// empty frame, but it then receives only the first reply. A subscriber
// that sees a gap in seq, or that joined late, fills it so: a batch is
// buffered before it is sent, so every batch seen live can be replayed.
//
// # Usage
//
//	p, err := kvevents.Open(ctx, kvevents.Config{
//		Endpoint:       "tcp://127.0.0.1:5557",
//		ReplayEndpoint: "tcp://127.0.0.1:5558",
//		Topic:          "kv@pod-0@llama",
//		Medium:         kvevents.MediumCPU, // memstore; MediumStorage for Mooncake
//	})
//	if err != nil { ... }
//	defer p.Close()
//	// each step, after the store changed:
//	err = p.Publish([]kvevents.Event{{
//		Kind: kvevents.BlockStored, Hashes: hashes, Parent: parent,
//		Tokens: tokens, BlockSize: 16,
//	}})
//
// A connector's events ([connector.KVEvent], from an
// [connector.EventSource]) convert with [FromConnector]: the blocks, the
// parent, the block size, the group, the medium of a store in tiers, and
// the tokens when the engine gave the connector Request.Tokens.
// connector/storeconn also announces the blocks its store evicts or
// removes (BlockRemoved) when the store reports them (store.Watcher), and
// an AllBlocksCleared when it lost track.
//
// # What a router can recompute
//
// A block hash on the wire is the last 8 bytes of kvconnect's BLAKE3 chain
// hash (hashing/SPEC.md), not vLLM's: a router that compares hashes it
// computed itself with vLLM's hash function finds no match. Routers that
// re-hash the event's token_ids with a function of their own (llm-d's
// indexer) index the blocks under their own keys and map block_hashes to
// them, which needs the tokens (events without token_ids are ignored
// there), the block size, and each parent announced before its children
// (connector/storeconn keeps that order). From an event a router can
// recompute: the prefix of plain text blocks, the multimodal items of a
// block (extra_keys, vLLM's [identifier, offset]) and the adapter
// (lora_name). It cannot recompute: a cache salt (never sent), an adapter's
// weight fingerprint, opaque extra keys, or the weights generation (a
// rotation is an AllBlocksCleared); an engine publishes the blocks of such
// requests without tokens (see [Event].ExtraKeys) so that they are not
// indexed as a plain prompt's.
//
// The sockets bind exactly the configured address and nothing else; there
// is no default endpoint. Bind a loopback or private address: the events
// name the tokens of every cached prompt.
//
// # Concurrency
//
// A [Publisher] is safe for concurrent use. Publish encodes the batch on
// the caller's goroutine and queues it; it never waits for the network
// or for a subscriber. When [Config.MaxQueueSize] batches wait, new ones
// are dropped and counted ([Stats].DroppedBatches); a subscriber that
// falls [Config.HWM] messages behind loses messages, counted in
// [Stats].SubscriberDrops, and can replay them. A batch gets its seq when
// the sender takes it, so dropped batches leave no gap. The publisher owns
// a sender goroutine, a replay goroutine and the sockets' goroutines;
// [Publisher.Close] sends what is queued (bounded by
// [Config.CloseTimeout]) and joins them all.
//
// # Compatibility with vLLM's publisher
//
// Config's JSON names are vLLM's KVEventsConfig names (endpoint,
// replay_endpoint, buffer_steps, hwm, max_queue_size, topic), with the
// same defaults, plus medium, data_parallel_rank and format. Unlike vLLM,
// the publisher always binds (vLLM connects to an endpoint without a
// wildcard), does not add the data-parallel rank to the ports, supports
// only tcp:// endpoints, and does not answer ZMTP heartbeats.
package kvevents
