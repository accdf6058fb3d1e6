// Package driver is for people who write connectors: what a connector's
// halves share that an engine never calls. A [Tally] merges what the
// workers report about each transfer; a [PlanBuffer] hands out each
// step's Metadata while the next one fills; [CheckTables] and [Table]
// check and read the block tables of the calls. Package connector holds
// the contract itself (connector.Planner, connector.Worker,
// connector.Driver) and, in its doc's section "For connector
// implementations", the methods of its types that only connectors call.
//
// # Concurrency
//
// None of its types is safe for concurrent use: a connector's halves use
// them from the goroutine that calls the half.
package driver
