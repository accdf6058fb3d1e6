package mooncake_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/mooncake"
)

func ExampleParseConfig() {
	cfg, err := mooncake.ParseConfig([]byte(`{
		"local_hostname": "node1",
		"metadata_server": "P2PHANDSHAKE",
		"master_server_address": "10.0.0.1:50051",
		"global_segment_size": "4GB",
		"local_buffer_size": 536870912,
		"protocol": "tcp",
		"device_name": ""
	}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(cfg.MasterServerAddress, cfg.GlobalSegmentSize, cfg.LocalBufferSize, cfg.Protocol)

	_, err = mooncake.ParseConfig([]byte(`{"local_hostname": "node1", "metadata_server": "P2PHANDSHAKE",
		"master_server_address": "10.0.0.1:50051", "global_segment_size": "4QB"}`))
	fmt.Println(err)
	// Output:
	// 10.0.0.1:50051 4GB 512MB tcp
	// mooncake: config: field global_segment_size: invalid size "4QB": want bytes, or a number with a unit of KB, MB, GB or TB
}

func ExampleParseSize() {
	for _, s := range []string{"3355443200", "1.5GB", "512 mb"} {
		n, err := mooncake.ParseSize(s)
		fmt.Println(uint64(n), n, err)
	}
	// Output:
	// 3355443200 3200MB <nil>
	// 1610612736 1536MB <nil>
	// 536870912 512MB <nil>
}

func ExampleOpen() {
	cfg, err := mooncake.ConfigFromEnv() // MOONCAKE_CONFIG_PATH, or MOONCAKE_MASTER
	if err != nil {
		log.Fatal(err)
	}
	s, err := mooncake.Open(context.Background(), cfg)
	if errors.Is(err, store.ErrUnavailable) {
		log.Fatalf("no Mooncake Store here: %v", err) // or fall back to store/memstore
	}
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	// Register KV memory with s, then Put and Get batches of blocks.
}
