package storeconn_test

import (
	"context"
	"fmt"

	"github.com/kvconnect/kvconnect/connector"
	_ "github.com/kvconnect/kvconnect/connector/storeconn" // registers StoreConnector
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// Example configures the store connector from a kv_transfer_config, with a
// misspelt key first, and shows what one saved block costs in the store:
// its bytes and the 24-byte trailer that every load checks.
func Example() {
	st, err := memstore.New(memstore.Config{Capacity: 16 << 20})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	id := hashing.Identity{
		Tenant: "acme", Model: "m", WeightsVersion: "v1",
		Format: hashing.Format{Device: "cpu", ModelDType: hashing.BF16, KVDType: hashing.BF16},
		Layout: hashing.Layout{Layers: 1, KVHeads: 2, HeadDim: 4, BlockSize: 4, TPSize: 1, Replication: 1},
	}
	env := connector.Env{Identity: id, Store: st}

	bad, _ := connector.ParseConfig([]byte(`{"kv_connector": "StoreConnector", "kv_connector_extra_config": {"lookup_wrokers": 4}}`))
	_, err = connector.OpenPlanner(bad, env)
	fmt.Println(err)

	cfg, err := connector.ParseConfig([]byte(`{"kv_connector": "StoreConnector", "kv_connector_extra_config": {"lookup": "sync"}}`))
	if err != nil {
		panic(err)
	}
	s, err := connector.OpenPlanner(cfg, env)
	if err != nil {
		panic(err)
	}
	defer s.Close()
	w, err := connector.OpenWorker(cfg, env)
	if err != nil {
		panic(err)
	}
	defer w.Close()
	kv := connector.KVCache{Layers: 1, Blocks: 2, KV: 2, BlockBytes: 64, Order: connector.BlockMajor}
	mem, err := rdma.AllocHost(kv.Blocks * kv.BlockSize())
	if err != nil {
		panic(err)
	}
	defer mem.Free()
	kv.Regions = []rdma.Region{mem.Region()}
	if err := w.Register(kv); err != nil {
		panic(err)
	}

	// One request of one full block and a token: the block is saved.
	hashes, _ := hashing.HashBlocks(4, []hashing.Token{1, 2, 3, 4, 5})
	r := &connector.Request{ID: "r", Prompt: 5, Hashes: hashes}
	if err := s.Scheduled(r, r.Prompt, []connector.BlockID{0, 1}); err != nil {
		panic(err)
	}
	if err := w.Start(context.Background(), s.Plan()); err != nil {
		panic(err)
	}
	if err := w.Save(context.Background(), connector.Ready); err != nil {
		panic(err)
	}
	for keep, _ := s.Finish(r, nil); keep; {
		p, err := s.Update([]*connector.Output{w.Poll()})
		if err != nil {
			panic(err)
		}
		keep = len(p.Released) == 0
		if keep {
			w.Start(context.Background(), s.Plan())
		}
	}
	fmt.Printf("block of %d bytes stored as a value of %d bytes\n", kv.BlockSize(), st.Stats().Bytes)
	// Output:
	// connector: invalid config: kv_connector_extra_config.lookup_wrokers is not a key of StoreConnector (did you mean "lookup_workers"?)
	// block of 128 bytes stored as a value of 152 bytes
}
