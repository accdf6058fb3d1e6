package storeconn_test

import (
	"context"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/storetest"
	"github.com/kvconnect/kvconnect/store/tiered"
)

// ramOver returns a store in tiers of a memstore ("CPU") over low
// ("DISK"), and the memstore.
func ramOver(t *testing.T, low store.Store) (*tiered.Store, *memstore.Store) {
	t.Helper()
	ram, err := memstore.New(memstore.Config{Capacity: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	st, err := tiered.New(tiered.Config{Tiers: []tiered.Tier{
		{Store: ram, Medium: tiered.MediumCPU},
		{Store: low, Medium: tiered.MediumDisk},
	}})
	if err != nil {
		ram.Close()
		low.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, ram
}

// onlyLow saves the 8 blocks of a prompt into both tiers, removes them
// from the top one, and loads the first 4 (from the lower tier, which
// promotes them): the first 4 are then in both tiers, the next 4 only in
// the lower one.
func onlyLow(r *rig, ram *memstore.Store) {
	r.t.Helper()
	r.saveAll(request("a", 8*bs+1))
	if _, err := ram.RemoveAll(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	r.loadOnce(request("b", 4*bs+1))
}

// TestLoadTokensByTier: a worker counts the tokens it loaded by the
// medium of the tier that served them, a block stored whole or in layer
// chunks.
func TestLoadTokensByTier(t *testing.T) {
	for _, chunks := range []int{1, 2} {
		st, ram := ramOver(t, newMemUnowned(t))
		r := newRig(t, st, identity(1, 1), map[string]any{"lookup": "sync", "layer_chunks": chunks})
		onlyLow(r, ram)
		got := loadTokens(r.ws[0])
		if want := (tokens{Disk: 4 * bs}); got != want {
			t.Errorf("layer_chunks %d: after a load of 4 blocks from the lower tier, LoadTokens = %+v, want %+v", chunks, got, want)
		}
		// 4 blocks from the top tier (promoted by the last load), 4 from
		// the lower one.
		r.loadOnce(request("c", 8*bs+1))
		got = loadTokens(r.ws[0])
		if want := (tokens{CPU: 4 * bs, Disk: 8 * bs}); got != want {
			t.Errorf("layer_chunks %d: after a load of 4 blocks from each tier, LoadTokens = %+v, want %+v", chunks, got, want)
		}
	}
	// A store that does not say which tier served a key counts nothing.
	r2 := newRig(t, newMem(t), identity(1, 1), map[string]any{"lookup": "sync"})
	r2.saveAll(request("a", 4*bs+1))
	r2.loadOnce(request("b", 4*bs+1))
	if got := loadTokens(r2.ws[0]); got != (tokens{}) {
		t.Errorf("over a memstore, LoadTokens = %+v, want none", got)
	}
}

// TestSlowTierNotMatched: with prefill_tokens_per_s, a store in tiers is
// judged tier by tier. Loads from a lower tier over a slow link
// (storetest's Faulty Bandwidth) are measured slower than the prefill
// rate; after one, blocks only that tier holds count in no match but for
// one match in 16 (which measures it again), while the blocks before them
// that the fast top tier holds still count.
func TestSlowTierNotMatched(t *testing.T) {
	// Values of 256 bytes and more at 2 KiB/s: a load of 4 blocks (16
	// tokens) from the lower tier takes half a second at least, so it runs
	// at 32 tokens/s at most, however fast the machine; the top tier's
	// loads are never measured. A store call may take a while over the
	// slow link: store_timeout leaves it minutes.
	slow := storetest.NewFaulty(newMemUnowned(t), storetest.FaultOptions{Bandwidth: 2 << 10})
	st, ram := ramOver(t, slow)
	r := newRig(t, st, identity(1, 1), map[string]any{"lookup": "sync", "prefill_tokens_per_s": 1000, "store_timeout": "2m"})
	onlyLow(r, ram)
	matched := map[int]int{} // blocks counted: matches
	for i := range 16 {
		m, err := r.s.Match(request(string(rune('c'+i)), 8*bs+1), 0)
		if err != nil {
			t.Fatal(err)
		}
		matched[m.Tokens/bs]++
	}
	skipped := r.s.(connector.StatsReporter).Stats().SlowSkipped
	if matched[4] != 15 || matched[8] != 1 || skipped != 15*4 {
		t.Errorf("matches of 4 blocks in the top tier and 4 more in the slow one: counted blocks %v (blocks: matches), SlowSkipped %d; want 15 matches of 4 blocks, 1 of 8 (the probe), and 60 skipped", matched, skipped)
	}
}

// newMemUnowned is a memstore for a store in tiers, which closes it.
func newMemUnowned(t *testing.T) *memstore.Store {
	t.Helper()
	st, err := memstore.New(memstore.Config{Capacity: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// tokens are a worker's Stats.LoadTokens fields.
type tokens struct{ CPU, Disk, Storage, Other int64 }

func loadTokens(w connector.Worker) tokens {
	st := w.(connector.StatsReporter).Stats()
	return tokens{st.LoadTokensCPU, st.LoadTokensDisk, st.LoadTokensStorage, st.LoadTokensOther}
}

// TestSlowTierNotMatchedGroups: with KV cache groups, the match over a
// store in tiers ends at the last point the request can resume from
// without the blocks only the slow tier holds: there the full-attention
// blocks, the window before it and the state at it are all in the fast
// tier.
func TestSlowTierNotMatchedGroups(t *testing.T) {
	slow := storetest.NewFaulty(newMemUnowned(t), storetest.FaultOptions{Bandwidth: 2 << 10})
	st, ram := ramOver(t, slow)
	h := newHybridRigOn(t, st, map[string]any{"prefill_tokens_per_s": 1000, "store_timeout": "2m"})
	h.fill(3)
	h.save(request("a", 8*bs+1), blocks(9), blocks(9), blocks(9))
	if _, err := ram.RemoveAll(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Resuming at block 4 loads the full-attention blocks 0..3, the
	// window's blocks 2 and 3, and the state after block 3, all from the
	// slow tier, which promotes them.
	if _, loaded, fails := h.load(request("b", 4*bs+1), 4*bs, blocks(5), blocks(5), blocks(5)); !loaded || len(fails) > 0 {
		t.Fatalf("load from the slow tier: loaded %v, failures %+v", loaded, fails)
	}
	matched := map[int]int{} // blocks counted: matches
	for i := range 16 {
		m, err := h.s.Match(request(string(rune('c'+i)), 8*bs+1), 0)
		if err != nil {
			t.Fatal(err)
		}
		matched[m.Tokens/bs]++
	}
	skipped := h.s.(connector.StatsReporter).Stats().SlowSkipped
	if matched[4] != 15 || matched[8] != 1 || skipped != 15*4 {
		t.Errorf("matches of 8 blocks, resumable at block 4 from the top tier: counted blocks %v (blocks: matches), SlowSkipped %d; want 15 matches of 4 blocks, 1 of 8 (the probe), and 60 skipped", matched, skipped)
	}
}
