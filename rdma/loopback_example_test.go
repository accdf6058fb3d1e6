//go:build unix

package rdma_test

import (
	"context"
	"fmt"
	"log"

	"github.com/kvconnect/kvconnect/rdma"
)

// Two engines on one fabric: the consumer reads a block straight out of
// the producer's registered memory, at the address the producer told it.
func ExampleFabric() {
	check := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	fabric := rdma.NewFabric()
	producer, err := fabric.NewEngine("producer", nil)
	check(err)
	defer producer.Close()
	consumer, err := fabric.NewEngine("consumer", nil)
	check(err)
	defer consumer.Close()

	pmem, err := rdma.AllocHost(4096)
	check(err)
	defer pmem.Free()
	cmem, err := rdma.AllocHost(4096)
	check(err)
	defer cmem.Free()
	copy(pmem.Bytes(), "KV block 7")
	check(producer.Register(pmem.Region()))
	check(consumer.Register(cmem.Region()))

	// Out of band, the producer hands over its segment name and address.
	name, addr := producer.Segment(), pmem.Region().Addr

	ctx := context.Background()
	seg, err := consumer.Open(ctx, name)
	check(err)
	batch, err := consumer.NewBatch(1)
	check(err)
	local, err := cmem.Region().Sub(0, 10)
	check(err)
	check(batch.Submit([]rdma.Request{{Op: rdma.Read, Local: local, Segment: seg, Remote: addr}}))
	check(batch.Wait(ctx))
	r := batch.Result(0)
	check(batch.Release())
	fmt.Println(r.Status, r.Bytes, string(cmem.Bytes()[:10]))
	// Output: completed 10 KV block 7
}
