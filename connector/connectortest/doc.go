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
// # Concurrency
//
// Run drives one engine per tenant from the test's goroutine; the connector
// may run transfers on goroutines of its own.
package connectortest
