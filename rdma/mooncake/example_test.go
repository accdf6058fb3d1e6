package mooncake_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/mooncake"
)

// A decode instance reads a block from a prefill instance in another
// process, given the prefill's segment name and the block's address there.
func Example() {
	ctx := context.Background()
	eng, err := mooncake.Open(ctx, mooncake.Config{Hostname: "127.0.0.1"})
	if errors.Is(err, mooncake.ErrUnavailable) {
		fmt.Println("no transfer engine here:", err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer eng.Close()

	mem, err := rdma.AllocHost(2 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer mem.Free()
	if err := eng.Register(mem.Region()); err != nil {
		log.Fatal(err)
	}
	defer eng.Unregister(mem.Region())

	peer, peerAddr := "10.0.0.12:15873", uintptr(0x7f3a00000000) // from the prefill's transfer parameters
	seg, err := eng.Open(ctx, peer)
	if err != nil {
		log.Fatal(err)
	}
	batch, err := eng.NewBatch(1)
	if err != nil {
		log.Fatal(err)
	}
	if err := batch.Submit([]rdma.Request{{Op: rdma.Read, Local: mem.Region(), Segment: seg, Remote: peerAddr}}); err != nil {
		log.Fatal(err)
	}
	if err := batch.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(batch.Result(0).Status)
	if err := batch.Release(); err != nil {
		log.Fatal(err)
	}
}
