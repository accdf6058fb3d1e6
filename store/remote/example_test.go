package remote_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/remote"
)

// A store served on a unix socket, and a client of it: in practice the
// two live in different processes.
func Example() {
	dir, err := os.MkdirTemp("", "remote-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "kv.sock")

	// The process that holds the store.
	s, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	srv, err := remote.NewServer(s, remote.ServerOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	l, err := remote.Listen("unix", path)
	if err != nil {
		fmt.Println(err)
		return
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	// A worker process.
	ctx := context.Background()
	c, err := remote.Dial(ctx, "unix", path, remote.ClientOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	mem, err := rdma.AllocHost(8192)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mem.Free()
	if err := c.Register(mem.Region()); err != nil {
		fmt.Println(err)
		return
	}
	src, _ := mem.Region().Sub(0, 4096)
	dst, _ := mem.Region().Sub(4096, 4096)
	copy(src.Bytes(), "a block of KV cache")

	res := make([]store.Result, 2)
	if err := c.Put(ctx, []string{"tenant/block-1"}, []rdma.Region{src}, res[:1]); err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Get(ctx, []string{"tenant/block-1", "tenant/block-2"}, []rdma.Region{dst, dst}, res); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("block-1: %d bytes, %q\n", res[0].N, dst.Bytes()[:19])
	fmt.Printf("block-2: %v\n", res[1].Err)

	fmt.Println(c.Close(), srv.Close(), <-served)
	// Output:
	// block-1: 4096 bytes, "a block of KV cache"
	// block-2: store: not found
	// <nil> <nil> remote: server closed
}
