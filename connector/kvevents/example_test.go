package kvevents_test

import (
	"context"
	"fmt"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/kvevents"
	"github.com/kvconnect/kvconnect/hashing"
)

// The publisher of an engine over memstore, on loopback. Port 0 lets the
// system choose (and binds); a deployment names fixed ports, for example
// tcp://127.0.0.1:5557 with Mode ModeBind (a host that is not a wildcard
// is connected to otherwise, as vLLM does) and tcp://127.0.0.1:5558.
func Example() {
	p, err := kvevents.Open(context.Background(), kvevents.Config{
		Endpoint:       "tcp://127.0.0.1:0",
		ReplayEndpoint: "tcp://127.0.0.1:0",
		Topic:          "kv@pod-0@llama",
		Medium:         kvevents.MediumCPU,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()

	hashes, err := hashing.HashBlocks(4, []hashing.Token{1, 2, 3, 4, 5, 6, 7, 8})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Two blocks were saved: their hashes, their tokens, in chain order.
	err = p.Publish([]kvevents.Event{{
		Kind:      kvevents.BlockStored,
		Hashes:    hashes,
		Tokens:    []hashing.Token{1, 2, 3, 4, 5, 6, 7, 8},
		BlockSize: 4,
	}})
	fmt.Println(err)
	// A connector's event converts; it has no tokens or parent hash.
	ev := kvevents.FromConnector(connector.KVEvent{Kind: connector.BlockRemoved, Hashes: hashes[1:]}, 4)
	fmt.Println(ev.Kind, p.Publish([]kvevents.Event{ev}))
	// Output:
	// <nil>
	// BlockRemoved <nil>
}

// Config decodes from the JSON of vLLM's --kv-events-config, plus medium.
func ExampleConfig_Validate() {
	err := kvevents.Config{Endpoint: "tcp://127.0.0.1:5557"}.Validate()
	fmt.Println(err)
	err = kvevents.Config{Endpoint: "tcp://127.0.0.1:5557", Medium: kvevents.MediumCPU, HWM: -1}.Validate()
	fmt.Println(err)
	// Output:
	// kvevents: medium = "": required (CPU for memstore, STORAGE for Mooncake)
	// kvevents: hwm = -1: negative (0 is the default)
}
