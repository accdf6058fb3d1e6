package shm_test

import (
	"context"
	"fmt"
	"log"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/shm"
)

// A decode engine reads a block out of a prefill engine's shared memory
// (here in the same process; a peer process does the same with the
// segment name and the address it was told).
func Example() {
	check := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	prefill, err := shm.New(nil)
	check(err)
	kv, err := prefill.Alloc(1 << 20)
	check(err)
	defer func() {
		check(prefill.Close()) // first: registered memory is not freed
		check(kv.Free())
	}()
	check(prefill.Register(kv.Region()))
	copy(kv.Bytes()[4096:], "block 1 of the prompt")

	decode, err := shm.New(nil)
	check(err)
	dst, err := decode.Alloc(4096)
	check(err)
	defer func() {
		check(decode.Close())
		check(dst.Free())
	}()
	check(decode.Register(dst.Region()))

	// Told out of band: the segment name and the block's address.
	name, addr := prefill.Segment(), kv.Region().Addr+4096

	ctx := context.Background()
	seg, err := decode.Open(ctx, name)
	check(err)
	b, err := decode.NewBatch(1)
	check(err)
	check(b.Submit([]rdma.Request{{Op: rdma.Read, Local: dst.Region(), Segment: seg, Remote: addr}}))
	check(b.Wait(ctx))
	fmt.Println(b.Result(0).Status, string(dst.Bytes()[:21]))
	check(b.Release())
	// Output: completed block 1 of the prompt
}
