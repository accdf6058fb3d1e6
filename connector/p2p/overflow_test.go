//go:build unix

package p2p

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/rdma"
)

// TestLayoutOverflow: layouts whose size does not fit (a product of
// layers, kv, blocks and block bytes past 2^50 bytes, which in int64 would
// wrap to 0, to a negative size, or to the size of a real region) and
// mailboxes that wrap around are refused, naming the field and its value.
func TestLayoutOverflow(t *testing.T) {
	const rank = `{"segment":"s","regions":[4096],"mailbox":8192,"slots":16,"layers":2,"blocks":8,"kv":2,"block_bytes":64,"order":"block-major"}`
	for _, tc := range []struct{ name, from, to, want string }{
		{"wraps to 0", `"layers":2,"blocks":8,"kv":2,"block_bytes":64`, `"layers":2147483648,"blocks":2147483648,"kv":2,"block_bytes":2`, "blocks = 2147483648"},
		{"wraps negative", `"layers":2,"blocks":8,"kv":2,"block_bytes":64`, `"layers":2147483648,"blocks":2147483648,"kv":2,"block_bytes":1`, "blocks = 2147483648"},
		{"wraps to a region's size", `"layers":2,"blocks":8,"kv":2,"block_bytes":64`, `"layers":1,"blocks":4611686018427387905,"kv":1,"block_bytes":4096`, "blocks = 4611686018427387905"},
		{"block bytes", `"block_bytes":64`, `"block_bytes":9223372036854775807`, "block_bytes = 9223372036854775807"},
		{"too large", `"blocks":8`, `"blocks":35184372088832`, "blocks = 35184372088832"},
		{"mailbox wraps", `"mailbox":8192`, `"mailbox":18446744073709551608`, "mailbox = 0xfffffffffffffff8"},
		{"slots", `"slots":16`, `"slots":2305843009213693952`, "slots = 2305843009213693952"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(rank, tc.from, tc.to, 1)
			if bad == rank {
				t.Fatalf("the replacement did not apply")
			}
			_, err := decodeRank([]byte(bad))
			if !errors.Is(err, ErrParams) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decodeRank(%s) = %v, want ErrParams naming %q", tc.to, err, tc.want)
			}
		})
	}

	// A worker refuses such a layout of its own memory, even where
	// KVCache.Validate's int64 product wraps to the region's size.
	m, err := rdma.AllocHost(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	f := rdma.NewFabric()
	e, err := f.NewEngine("w", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	_, ws, err := New(connector.Config{Connector: Name, Role: connector.RoleConsumer}, connector.Env{Identity: testIdentity(nodeOpts{tenant: "tenant0", tp: 1, repl: 1, bs: 4})}, e)
	if err != nil {
		t.Fatal(err)
	}
	defer ws[0].Close()
	kv := connector.KVCache{Layers: 1, KV: 1, Blocks: 1<<62 + 1, BlockBytes: 4096, Order: connector.BlockMajor, Regions: []rdma.Region{m.Region()}}
	if err := ws[0].Register(kv); err == nil || !strings.Contains(err.Error(), "Blocks = 4611686018427387905") {
		t.Errorf("Register(%d blocks of 4096 bytes in a 4096-byte region) = %v, want an error naming KVCache.Blocks", kv.Blocks, err)
	}
}
