// Package connectortest checks that a connector keeps the promises of
// package connector. Any connector, ours or a third party's, runs it from a
// test:
//
//	func TestConnector(t *testing.T) {
//		connectortest.Run(t, openMyPair, connectortest.Options{NewStore: newStore})
//	}
//
// Run drives the connector from a model engine with paged KV memory in
// which every block's bytes are a known function of the tenant, the weights
// generation, the shard and the block hash, and checks byte for byte that
// every block the connector loads holds exactly what was saved under its
// key, that no match crosses a namespace or covers the last prompt token,
// that hits agree across shards, that no block is written after the engine
// freed it, and that blocks kept after a request ends are always released.
// The state machine runs with pgregory.net/rapid: failures shrink to a
// short sequence of engine actions, and -rapid.checks sets how many cases
// run.
//
// Store faults come from store/storetest's Faulty wrapper.
//
// A connector for disaggregated prefill and decode (one that hands a
// request's KV from a producer instance to a consumer instance, such as
// connector/p2p) sets Options.OpenConsumer: Run then drives two model
// engines, prefilling on the producer and handing each request on with the
// transfer parameters of the producer's connector.TransferParamsSource, and
// checks the consumer's loads the same way.
//
// # Concurrency
//
// Run drives one engine per tenant from the test's goroutine; the connector
// may run transfers on goroutines of its own.
package connectortest
