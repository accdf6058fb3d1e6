// Package p2p is a peer-to-peer KV connector for disaggregated prefill and
// decode: the producer (kv_producer, the prefill instance) keeps a
// finished request's blocks in its own KV memory, and the consumer
// (kv_consumer, the decode instance) reads them straight into the blocks it
// allocated, through an [rdma.Engine]: [rdma.Loopback] in one process,
// rdma/shm across the processes of one host, rdma/mooncake across
// processes and hosts. No store is involved and no byte is staged.
//
// Open the halves with [New], giving it the transfer engines, or by name
// ("P2PConnector", [Name]) from kv_transfer_config: connector.OpenPlanner
// first, then connector.OpenWorker for each rank, with the same engine_id,
// in the same process. A worker opened by name uses the transfer engine in
// Env.Engine, or opens one itself by kv_connector_extra_config
// "transfer": "loopback", "shm" or "mooncake" (see [TransferLoopback],
// [TransferShm], [TransferMooncake]), which its Close closes.
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
// # The mailbox: how the consumer says it is done
//
// Each producer worker registers a mailbox beside its KV memory: a header
// of 64 bytes, then mailbox_slots slots of 64 bytes, slot i at
// Rank.Mailbox+64+64i. Everything goes over the transfer engine: no other
// channel between the instances is needed.
//
//	header: offset 0   "KVmbox", 0, the parameters' version
//	        offset 8   the mailbox seal: BLAKE3-256 of the worker's Rank
//	                   (segment, regions, mailbox, slots, nonce, digest
//	                   table, layout)
//	slot:   offset 0   offer word, written only by the producer's worker:
//	                   0 (never used), or offer<<2|1 (armed), offer<<2|2 (ended)
//	        offset 8   done word, written only by consumers' workers: the
//	                   ticket of the last consumer that said it is done
//	        offset 16  the offer seal: BLAKE3-256 of the offer's parameters,
//	                   written before the offer is armed
//
// Words are in the hosts' byte order. An offer is named by its slot and
// its ID (Params.Slot, Params.Offer), a sequence number unique among the
// producer's offers that only grows, so a slot's offer words only grow
// too; the slot is ID mod mailbox_slots, and the scheduler half gives a
// slot to one offer at a time. Each word has a single writer, so no write
// overwrites the other side's, and no remote compare-and-swap is needed.
// Each offer has a ticket (Params.Ticket), 64 random bits that only its
// parameters carry: the producer takes the offer for done only when the
// done word holds its ticket, so a notice can never be taken for another
// offer's, whatever the order of the writes.
//
// The producer's worker:
//  1. arms the offer once the digests of its blocks are in the digest
//     table: writes the offer seal into the slot, then armed(offer) into
//     the offer word; it does so when the scheduler half of its process
//     makes the offer in Finish, and a worker of another process when it
//     starts the Metadata that carries it (the Save carries the offer's
//     parameters);
//  2. in each Poll, takes the offer for done when the done word holds its
//     ticket, or for expired when keep_timeout passed since it was armed;
//     either way it writes ended(offer) into the offer word before it
//     reports the offer (after which the engine may reuse the blocks);
//  3. in Close, writes ended(offer) for every offer it holds.
//
// The consumer's worker:
//  1. reads the mailbox header and checks its magic and mailbox seal
//     against the Rank the parameters describe; if they differ it writes
//     nothing and reads nothing more (the parameters are refused: see
//     "Transfer parameters are untrusted");
//  2. reads the slot until the offer word is armed(offer) (for up to
//     open_timeout), then checks the slot's offer seal against the
//     parameters; ended(offer), or the word of a newer offer, means the
//     offer is gone; another seal means the parameters are refused;
//  3. reads the blocks (and their digests), then the offer word again:
//     only if it is still armed(offer) were the blocks the offer's while
//     they were read;
//  4. writes the ticket into the done word, also when step 2 or 3 failed
//     for any reason but the offer being gone or refused (a timeout, a
//     transport error, Close): a notice written before the offer is armed
//     is kept, and the producer frees the blocks at its next Poll. It
//     writes nothing when the offer is gone (the slot may hold a newer
//     offer, whose notice it would erase), when the parameters were
//     refused, or when its transfers did not settle.
//
// A consumer that writes its notice just as the producer expires the
// offer and reuses the slot may erase the newer offer's notice: that
// offer is then released after keep_timeout, never early.
//
// # Transfer parameters are untrusted
//
// In vLLM-style deployments the parameters come back to the consumer in
// the API request's body (kv_transfer_params): a client can forge them.
// Whatever they say, a consumer loads only blocks the producer offered
// under the offer they name, verifies them as its own setting says, and
// writes only into a producer's mailbox, never into memory that holds KV:
//
//   - Blocks of another offer: the offer seal binds the offer's number,
//     slot, ticket, block ids, block hashes, namespace and every rank's
//     memory. Parameters that name an armed offer with other blocks (say,
//     the attacker's own offer with another request's block ids), another
//     digest table or other regions do not match the seal the producer
//     wrote: the load fails from its first block, nothing of it is
//     reported loaded.
//   - Verification switched off: a consumer with "verify": "checksum"
//     refuses parameters whose ranks publish no digest table (Digests 0),
//     in SetParams and again in the worker, however the load reached it;
//     and the mailbox seal covers the digest table's address, so a forged
//     0 does not match the producer's header either.
//   - Writes into KV memory: the consumer writes only its done notice, and
//     only into the slot of a mailbox whose header it read and checked
//     first; memory that holds KV does not hold a header with the seal of
//     parameters a client chose (that would be a BLAKE3 preimage).
//   - An offer released early: the producer ends an offer only on its
//     ticket; a client that knows its own parameters cannot end another's
//     offer by its number, and a consumer writes no notice for parameters
//     the seal refutes.
//
// Each refusal is logged at warn level and counted in Stats.Refused (of
// the scheduler half for SetParams, of the workers for loads); its blocks
// fail with connector.ReasonCorrupt. What the seals do not stop: a client
// that holds genuine parameters of another request (they are what proves
// the offer; treat them as the request's secret, as vLLM treats
// kv_transfer_params), and a party that reaches the transfer engine
// itself (rdma/shm's segments, Mooncake's transfer engine, which listens
// on all interfaces): such a party reads and writes registered memory
// directly. See SECURITY.md at the repository's root.
//
// # A producer that is gone
//
// When a producer instance restarts or dies, loads from it may never be
// reported (its transport may keep them pending), and a request that
// Finish kept for such a load would stay kept. The engine, once it knows
// the producer is gone (its router or orchestrator says so), calls
// [Planner.Forget] with the producer's engine id (its kv_transfer_config
// engine_id, Params.Engine): in the next Update every load from it is
// failed from its first block, as any failed load is, the requests kept
// for them are released, and later reports of those loads are ignored.
// Give producers an engine_id, so that their parameters name them.
// Forget does not stop the workers' transfers: it is for a peer whose
// memory is gone, not a way to cancel loads from a live one.
//
// # Verified reads
//
// Each block a consumer reads is checked against the producer's CRC-32
// (IEEE) of it: the producer's workers write the digests of an offer's
// blocks into a table in their registered memory before they arm the
// offer (its address travels in the transfer parameters), and the
// consumer's workers read them with the blocks. A block that differs fails
// the load from that block on (Stats.Corrupt counts them, the reason is ReasonCorrupt); it is
// never reported loaded. KV in device memory is not verified: a producer
// with KV in device memory publishes no digests, and its consumers need
// "verify": "none", since a verifying consumer refuses parameters without
// digests.
//
// # Transfers that do not settle
//
// A load is reported (Progress.Loaded or Failed) only once every transfer
// it made is settled: final in the sense of [rdma.Status.Final], nothing
// moving its bytes any more. Until then the engine keeps the request's
// blocks (it may not run the request, and Finish keeps them), so a late
// transfer never writes a block that was recomputed or handed to another
// request. While the worker is open the wait has no bound (it is logged
// every 10 s): a transfer that never settles (a hung device or transport)
// is a hang of its load. A worker's Close waits for it for up to
// close_timeout, then gives up: the load is never reported, and Close
// returns an error wrapping [rdma.ErrBusy] and frees no memory the
// transfer may touch (the KV memory must stay allocated too). So Close
// never hangs on a dead peer, and when it returns nil no transfer of the
// worker writes the KV memory any more. A transfer engine that cannot tell
// whether a transfer ended (its Wait fails) is treated the same way.
// Closing the transfer engine ends its transfers (rdma/mooncake gives up
// after Config.CloseTimeout).
//
// # Across processes
//
// A producer and its consumers share nothing but the bytes of the
// transfer parameters: the producer's namespace and engine id, the offer
// and its mailbox slot, the block ids and hashes, and per rank the
// segment name, the KV regions' addresses and layout, the mailbox and the
// digest table. The consumer's scheduler half hands them to its workers in
// the Metadata (each load's Transfer.Params), so workers in other
// processes need only the Metadata's bytes and their engine. Within one
// instance, the workers of the scheduler half's process hand it their
// memory when they register, and arm each offer as Finish makes it;
// workers in another process hand their memory over with
// [Worker.Handshake] and [Planner.SetHandshake], and arm an offer when
// they start the Metadata that carries it.
//
// # Configuration
//
// kv_connector_extra_config keys: "keep_timeout" (how long a producer
// keeps an offer's blocks, "120s"), "close_timeout" (how long a worker's
// Close waits for transfers to settle, "30s"), "mailbox_slots" (offers a
// producer worker holds at once, 1024; both halves must agree, or the
// worker's Register fails), "open_timeout" (opening a producer's segment,
// waiting for an offer to be armed, and opening a Mooncake transfer
// engine, "10s"),
// "transfer" (the transfer engine a worker opened by name without
// Env.Engine opens: "loopback", "shm" or "mooncake"), "verify" (a
// producer publishes the CRC-32 of each block it offers, a consumer
// checks each block it reads against it: "checksum", the default, or
// "none": a consumer that verifies refuses parameters without digests).
// Any other key is an error naming it.
//
// # Concurrency
//
// As package connector says: each half is used from one goroutine; a
// Worker runs its loads on goroutines it owns and joins them in Close. The
// halves of one New share state under a lock.
package p2p
