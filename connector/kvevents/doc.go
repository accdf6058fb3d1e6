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
// ["", topic, seq, payload] for each buffered batch from start on, then
// ["", "", -1 as 8 bytes, ""]: after the empty delimiter, exactly the
// three frames that vLLM sends since 0.26 (vLLM PR 45177) and that
// llm-d-router 0.10 requires. [Config.LegacyReplay] sends the form of
// vLLM before 0.26 instead, ["", seq, payload] and ["", -1, ""], for
// consumers older than vLLM 0.26. A start past the newest batch gets the
// end marker alone. A REQ client may send [start], as its socket adds the
// empty frame, but it then receives only the first reply. A subscriber
// that sees a gap in seq, or that joined late, fills it so: a batch is
// buffered before it is sent, so every batch seen live can be replayed.
//
// # Usage
//
//	p, err := kvevents.Open(ctx, kvevents.Config{
//		Endpoint:       "tcp://127.0.0.1:5557",
//		Mode:           kvevents.ModeBind, // this host only; see Binding or connecting
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
// # Binding or connecting
//
// As vLLM's publisher, the PUB socket binds an endpoint whose host is a
// wildcard (tcp://*:5557, or an IPv6 host with "::") and connects to any
// other ([ModeAuto]): pointed at a router whose SUB binds (llm-d's
// static-endpoint mode), the engine connects to it. An endpoint with port
// 0 binds. [Config.Mode] forces [ModeBind] (for example to bind
// tcp://127.0.0.1:5557, this host only) or [ModeConnect]. The replay
// socket always binds.
//
// A connecting publisher returns from [Open] at once and connects in the
// background; a failed attempt or a lost connection is retried after
// 100 ms, doubling to 10 s (back to 100 ms after a connection that ended
// without the peer breaking a bound), each failure counted in
// [Stats].ConnectFailures. As with libzmq, batches sent while it has no
// connection ([Stats].Disconnected) wait for the next connection if the
// last one had subscribed to them, within [Config.HWM] (past it they are
// dropped and counted in [Stats].SubscriberDrops); the router then
// subscribes again, and batches sent before its subscription arrives are
// not delivered. Every batch is buffered for replay all the same. Publish
// never waits for a connection.
//
// # Security
//
// The sockets speak ZMTP with the NULL mechanism: there is no
// authentication and no encryption, and anyone who can reach an endpoint
// can subscribe to every event (which names the tokens of every cached
// prompt) and ask for replays. Who may connect is decided by the network:
// bind a loopback or private address (there is no default endpoint, and
// a socket binds exactly the address configured), or connect to the
// router's address. Peers are untrusted: they cannot make the publisher
// send wrong events, block Publish, or hold memory or goroutines past
// these bounds (each per socket, the PUB and the replay socket apart):
//
//   - peers: [Config.MaxPeers] connections, handshakes in progress
//     included (default [DefaultMaxPeers], 64); a connection over it is
//     closed at once ([Stats].PeersRefused);
//   - the handshake: 10 s, and a READY command of at most 8 KiB;
//   - a message a subscriber sends: 64 KiB and 16 frames (a subscription is
//     one frame; anything else is read and discarded frame by frame,
//     never buffered); a replay request: 1 KiB and 4 frames; a message,
//     once begun, arrives whole within 10 s ([Stats].PeersOversize,
//     [Stats].PeersIdle);
//   - subscriptions: 64 prefixes and 4 KiB of them per subscriber
//     ([Stats].PeersOverSubscribed); matching a batch's topic against
//     them costs at most one set lookup per byte of the topic, whatever
//     their number;
//   - idle time: a subscriber subscribes within 60 s of its handshake (a
//     subscribed one may stay silent: it only reads), and a replay client
//     sends each request within 60 s ([Stats].PeersIdle);
//   - what a peer does not read: [Config.HWM] messages queued per
//     subscriber, sharing the batches' bytes with the replay buffer; past
//     it messages are dropped for that subscriber
//     ([Stats].SubscriberDrops) and replay fills the gap; a replay client
//     has one whole replay queued at most (one more reply than
//     [Config.BufferSteps]; [Stats].ReplayDrops past it);
//   - ZMTP broken (a command inside a message, a wrong greeting or socket
//     type): [Stats].PeersMalformed.
//
// A peer over a bound is disconnected, counted by bound in [Stats] and
// logged at debug level; it may connect again (a connecting publisher
// retries with its backoff, doubled after such a peer). A replay request
// that is malformed is ignored and counted ([Stats].ReplayMalformed); one
// for a sequence past the buffer gets the end marker alone. The topic is
// checked at [Open]: UTF-8 of at most [MaxTopicBytes] bytes without control
// characters.
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
// same defaults, plus medium, data_parallel_rank, format, mode,
// legacy_replay and max_peers. It binds or connects by vLLM's rule and
// replies to replays in the frames of vLLM 0.26. Unlike vLLM, it does not
// add the data-parallel rank to the ports, supports only tcp:// endpoints,
// does not answer ZMTP heartbeats, and bounds its peers (see Security).
package kvevents
