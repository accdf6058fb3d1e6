// Package tiered is a [store.Store] made of other stores in tiers, top
// (fastest) first: for example store/memstore over store/diskstore over
// store/remote or store/mooncake. A connector uses it as any store.
//
// Exists and Get go top down and stop at the first tier that has the key.
// A hit in a lower tier is promoted: copied, from the caller's destination
// once the Get has the value, into the tiers above (Config.NoPromote turns
// it off). A put goes to the top tier, and to the lower ones either before
// it returns (write-through, the default) or later, from a goroutine of
// the Store (Config.WriteBack). A tier may be guarded by an admission
// filter (Tier.Filter): a frequency sketch in the spirit of TinyLFU keeps
// keys used fewer than Config.MinUses times off it, so one-off blocks do
// not wear the disk; a key that a Get finds above such a tier, once it
// reaches MinUses uses, is copied down into it.
//
// A put first asks the tiers, top down, whether they hold its keys (one
// Exists per tier that did not find them all): a key some tier holds is
// a duplicate. Over a remote tier that is a round trip per put batch.
//
// Every tier that holds a key holds the same value: puts, promotions,
// write-backs and removals of a key are serialised per key (256 stripes),
// and a put of a key that some tier holds is a duplicate. A tier that
// fails a key (a transfer error, a full tier) lets the next tier try; a
// key that no tier could serve is store.ErrNotFound, with the failure of
// a tier in the error's text. The one case in which two tiers may come to
// hold different values of a key is a put while the only tier holding it
// fails its Exists: a connector's keys name their content, so both
// values are the same bytes there.
//
// [Store.Tiers] gives each tier's hits, misses, promotions, demotions,
// filtered keys and its own Stats (keys, bytes, evictions). The Store is a
// [store.Watcher]: it relays the KeyEvents of its tiers that are
// Watchers, each with the tier's medium ("CPU", "DISK", "STORAGE"), so a
// router hears which tier a block reached or left; for a tier that is not
// a Watcher it reports the puts and removals it made there, but not the
// tier's evictions.
//
// The Store is a [store.Layered]: ExistsTier, GetTier and GetVTier are
// Exists, Get and GetV that also say which tier (an index into
// Config.Tiers, whose media [Store.Media] lists) found or served each key.
// connector/storeconn counts with them the tokens each tier served (the
// LoadTokens fields of connector.Stats, exported by connector/prom as
// kvconnect_connector_load_tokens_total{medium}), and, when its
// "prefill_tokens_per_s" is set, judges each tier by its own load rate:
// blocks in RAM still load while those only on a slow disk are
// recomputed.
//
// # Usage
//
//	ram, _ := memstore.New(memstore.Config{Capacity: 32 << 30})
//	disk, err := diskstore.Open(diskstore.Config{Dir: "/nvme/kv", Capacity: 2 << 40})
//	...
//	s, err := tiered.New(tiered.Config{Tiers: []tiered.Tier{
//		{Store: ram, Medium: tiered.MediumCPU},
//		{Store: disk, Medium: tiered.MediumDisk, Filter: true},
//	}})
//	...
//	defer s.Close() // closes ram and disk too
//
// # Concurrency
//
// A Store is safe for concurrent use if its tiers are. Gets and Exists run
// in parallel (one that misses a key while a put of that key is in flight
// waits for the put, or its context, and looks again); a put, promotion
// or removal holds the stripes of its keys
// (RemovePrefix and RemoveAll hold all of them). Close waits for the calls
// in flight and the write-back goroutine, then closes the tiers.
package tiered
