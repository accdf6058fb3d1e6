// Package p2p is a peer-to-peer KV connector for disaggregated prefill and
// decode: the producer (kv_producer, the prefill instance) keeps a
// finished request's blocks in its own KV memory, and the consumer
// (kv_consumer, the decode instance) reads them straight into the blocks it
// allocated, through an [rdma.Engine]: [rdma.Loopback] in one process,
// rdma/mooncake across processes and hosts. No store is involved and no
// byte is staged.
//
// It registers under [Name] ("P2PConnector"), but connector.Env does not
// carry a transfer engine yet: open the halves with [New].
//
// # Usage
//
// The producer's engine and the consumer's engine each open a connector
// with their own transfer engines (one per tensor-parallel rank):
//
//	prod, prodWorkers, err := p2p.New(connector.Config{Connector: p2p.Name, Role: connector.RoleProducer}, env, engines...)
//	cons, consWorkers, err := p2p.New(connector.Config{Connector: p2p.Name, Role: connector.RoleConsumer}, env, engines...)
//
// On the producer, when a request ends, Finish keeps its blocks and
// TransferParams returns its transfer parameters (like vLLM's
// kv_transfer_params: the producer's namespace, segment names, region
// addresses and layout per rank, block ids and hashes, and a mailbox
// slot). The engine returns them with the request; the router hands them
// to the consumer, whose engine calls SetParams before the request's first
// Match:
//
//	keep, err := prod.Finish(req, blocks)  // true: do not reuse the blocks yet
//	params, err := prod.TransferParams(req.ID)
//	...
//	err = cons.SetParams(req.ID, params)   // refused: ErrIdentity, ErrParams
//	m, err := cons.Match(req, localHit)    // the producer's blocks that are this prompt's
//
// From there both engines run the usual loop of package connector. The
// consumer's loads come back in Progress.Loaded, or, for blocks that did
// not arrive, Progress.Failed (recompute or fail, per
// kv_load_failure_policy). The producer's Progress.Released lists the
// request once the consumer told it it is done (every rank), or once
// keep_timeout passed without that; a consumer that reads after the
// producer gave up finds out and fails its blocks rather than keep bytes
// the producer may have reused.
//
// Parameters carry the producer's namespace: a consumer whose identity
// (tenant, model, weights version and generation, KV format, layout)
// differs refuses them, so KV never crosses identities.
//
// # How the consumer says it is done
//
// Each producer worker registers a mailbox beside its KV memory: one
// 8-byte slot per offer it may hold. It arms the offer's slot when the
// offer is made; the consumer's worker, after its reads, reads the slot
// back (still armed means the blocks were the offer's while it read) and
// writes it to say it is done. The producer clears a slot before it gives
// up on an offer. Everything goes over the transfer engine: no other
// channel between the instances is needed.
//
// # Verified reads
//
// Each block a consumer reads is checked against the producer's CRC-32
// (IEEE) of it: the producer's workers write the digests of an offer's
// blocks into a table in their registered memory before they arm the
// offer (its address travels in the transfer parameters), and the
// consumer's workers read them with the blocks. A block that differs fails
// the load from that block on (Stats.Corrupt counts them, the reason is ReasonCorrupt); it is
// never reported loaded. KV in device memory is not verified, nor loads
// from a producer that publishes no digests.
//
// # Transfers that do not settle
//
// A load is reported (Progress.Loaded or Failed) only once every transfer
// it made is settled: final in the sense of [rdma.Status.Final], nothing
// moving its bytes any more. Until then the engine keeps the request's
// blocks (it may not run the request, and Finish keeps them), so a late
// transfer never writes a block that was recomputed or handed to another
// request. The wait has no bound: a transfer that never settles (a hung
// device or transport) is a hang of its load and of the worker's Close,
// logged every 10 s. Transfer engines bound it themselves: closing one
// (rdma/mooncake gives up after Config.CloseTimeout) makes the wait fail;
// a load whose transfers' end cannot be told is then never reported, and
// the worker's Close returns an error wrapping [rdma.ErrBusy] and frees
// no memory those transfers may touch.
//
// # Configuration
//
// kv_connector_extra_config keys: "keep_timeout" (how long a producer
// keeps an offer's blocks, "120s"), "mailbox_slots" (offers a producer
// worker holds at once, 1024), "open_timeout" (opening a producer's
// segment, "10s"), "verify" (a producer publishes the CRC-32 of each block
// it offers, a consumer checks each block it reads against it: "checksum",
// the default, or "none"). Any other key is an error naming it.
//
// # Concurrency
//
// As package connector says: each half is used from one goroutine; a
// Worker runs its loads on goroutines it owns and joins them in Close. The
// halves of one New share state under a lock.
package p2p
