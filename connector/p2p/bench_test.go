//go:build unix

package p2p

import (
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/rdma"
)

// BenchmarkVerify measures what verified reads cost: a consumer worker's
// load of a 64-block offer (64 KiB blocks, 4 MiB) over loopback engines,
// by two consumers of one producer, one verifying (the default) and one
// not, alternately in the same run; and the producer worker's digest of
// the offer's blocks, which it computes before it arms the offer (on a
// goroutine of its own, not in Start). It reports each per load and the
// ratios to the unverified load; and the seals a consumer computes to
// check a load's parameters (its mailbox header and its offer's slot),
// per load and as a share of the unverified load. Loopback moves bytes
// with memmoves, so these are the ratios where the transfer is fastest;
// over a network the share of the digests and seals is smaller.
func BenchmarkVerify(b *testing.B) {
	const n = 64
	o := nodeOpts{tp: 1, repl: 1, bs: 16, blocks: n + 2, blockBytes: 16 << 10}
	f := rdma.NewFabric()
	po, vo, uo := o, o, o
	po.role, vo.role, uo.role = connector.RoleProducer, connector.RoleConsumer, connector.RoleConsumer
	uo.extra = map[string]any{"verify": "none"}
	p := newNode(b, f, "prefill", po)
	v := newNode(b, f, "verified", vo)
	u := newNode(b, f, "unverified", uo)
	b.Cleanup(func() {
		for _, nd := range []*node{v, u, p} {
			if err := nd.close(); err != nil {
				b.Error(err)
			}
		}
	})
	params := p.prefill("r", prompt(1, (n+1)*16))
	p.step(nil) // digests the blocks and arms the offer
	pp, err := DecodeParams(params)
	if err != nil {
		b.Fatal(err)
	}
	p.awaitArmed(pp.Offer, pp.Slot)
	plan := &loadPlan{params: pp, remote: pp.Blocks[:n]}
	blocks := make([]connector.BlockID, n)
	for i := range blocks {
		blocks[i] = connector.BlockID(i)
	}
	if v.workers[0].sums == nil || u.workers[0].sums != nil {
		b.Fatalf("the verifying consumer does not verify, or the other does")
	}
	pw := p.workers[0]
	slot := pw.slot(pp.Slot)
	load := func(w *Worker) time.Duration {
		slot.Store(armed(pp.Offer)) // the previous load consumed the offer
		start := time.Now()
		failures, bytes, stuck := w.read(1, blocks, plan, 0)
		d := time.Since(start)
		if len(failures) > 0 || stuck || bytes != int64(n*64<<10) {
			b.Fatalf("load: %d failures, %d bytes, stuck %v", len(failures), bytes, stuck)
		}
		return d
	}
	var verified, unverified, digest, seals time.Duration
	var sums []uint32
	var sink seal
	for b.Loop() {
		verified += load(v.workers[0])
		unverified += load(u.workers[0])
		start := time.Now()
		sums = pw.sums32(sums[:0], pp.Blocks[:n])
		digest += time.Since(start)
		// What each load computes to check its parameters (part of
		// both loads above): the mailbox seal and the offer seal.
		start = time.Now()
		sink = mailboxSeal(&pp.Ranks[0])
		sink = offerSeal(&pp)
		seals += time.Since(start)
	}
	if sink == (seal{}) {
		b.Fatal("a zero seal")
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(per(verified), "verified-ns/load")
	b.ReportMetric(per(unverified), "unverified-ns/load")
	b.ReportMetric(per(digest), "digest-ns/offer")
	b.ReportMetric(float64(verified)/float64(unverified), "verified/unverified")
	b.ReportMetric(float64(digest)/float64(unverified), "digest/unverified")
	b.ReportMetric(per(seals), "seals-ns/load")
	b.ReportMetric(float64(seals)/float64(unverified), "seals/unverified")
}
