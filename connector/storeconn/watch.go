package storeconn

import (
	"slices"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/store"
)

// maxTracked bounds the blocks a watching scheduler half remembers as
// announced: past it, it announces AllCleared and starts again from
// nothing (counted in Stats.Resyncs), as when its feed loses events.
const maxTracked = 1 << 22

// watch is the scheduler half's view of its store's key events, when the
// store is a [store.Watcher]: what it announced stored and not yet
// removed, and the keys of blocks whose save is in flight.
type watch struct {
	feed   *store.Feed
	buf    []store.KeyEvent
	stored map[groupHash]*announced
	flight map[groupHash]*flight
}

// announced is a block the half announced stored: where (the media), and
// what a BlockStored for another tier of a store in tiers repeats.
type announced struct {
	media  []string // "" is the store's first tier (the publisher's medium)
	parent hashing.BlockHash
	tokens []hashing.Token
}

// flight is what the feed said of the keys of a block while saves of it
// were in flight or their events held: for each key whether its latest
// event (of a store of one tier) took it away.
type flight struct {
	refs int             // saves in flight and BlockStored events held
	keys map[string]bool // key: its latest event is a Gone one
	gone int             // keys whose latest event is a Gone one
	lost bool            // the feed lost events meanwhile: its state is unknown
}

// openWatch starts watching st when it is a store.Watcher, with a feed of
// n events; nil when it is not.
func openWatch(st store.Store, n int) (*watch, error) {
	wt, ok := st.(store.Watcher)
	if !ok {
		return nil, nil
	}
	f, err := wt.Watch(n)
	if err != nil {
		return nil, err
	}
	return &watch{feed: f, stored: make(map[groupHash]*announced), flight: make(map[groupHash]*flight)}, nil
}

// fly records a save of block b going out.
func (w *watch) fly(b groupHash) {
	f := w.flight[b]
	if f == nil {
		f = &flight{}
		w.flight[b] = f
	}
	f.refs++
}

// land ends one save of b (stored, failed or announced); it reports
// whether the block is known to be whole in the store after it: no key's
// latest event took it away, and no event was lost meanwhile.
func (w *watch) land(b groupHash) (whole bool) {
	f := w.flight[b]
	if f == nil {
		return true
	}
	whole = f.gone == 0 && !f.lost
	if f.refs--; f.refs <= 0 {
		delete(w.flight, b)
	}
	return whole
}

// drainWatch turns the feed's events since the last call into KV events:
// see keyEvent. Events the feed lost make an AllCleared.
func (s *Planner) drainWatch() {
	w := s.w
	if w == nil {
		return
	}
	evs, lost := w.feed.Take(w.buf[:0])
	for _, e := range evs {
		s.keyEvent(e)
	}
	clear(evs)
	w.buf = evs
	if lost > 0 {
		s.resync(true)
	}
}

// resync announces that every block is cleared and forgets what it
// announced: the feed lost events (lost), or the half tracks too many
// blocks. After lost events, blocks in flight count as gone when they
// land: what happened to their keys is unknown.
func (s *Planner) resync(lost bool) {
	w := s.w
	s.stats.Resyncs++
	s.events = append(s.events, connector.KVEvent{Kind: connector.AllCleared, Generation: s.meta.Generation})
	clear(w.stored)
	if lost {
		for _, f := range w.flight {
			f.lost = true
		}
	}
}

// keyEvent acts on one key event of the store. Keys of other namespaces
// (another model, tenant or generation) are not the half's to announce.
func (s *Planner) keyEvent(e store.KeyEvent) {
	k, err := hashing.ParseKey(e.Key)
	if err != nil || k.Tenant != s.ns.Tenant() || k.Namespace != s.ns.ID() || k.Group >= len(s.groups) {
		return
	}
	w := s.w
	b := groupHash{k.Group, k.Hash}
	if f := w.flight[b]; f != nil && e.Medium == "" {
		gone, seen := f.keys[e.Key]
		switch {
		case e.Op.Gone() && !(seen && gone):
			f.gone++
		case e.Op == store.KeyStored && seen && gone:
			f.gone--
		}
		if f.keys == nil {
			f.keys = make(map[string]bool)
		}
		f.keys[e.Key] = e.Op.Gone()
	}
	a := w.stored[b]
	if a == nil {
		return
	}
	switch {
	case e.Op.Gone():
		// A block is gone from a tier when any of its keys is.
		i := slices.Index(a.media, e.Medium)
		if i < 0 && e.Medium != "" {
			i = slices.Index(a.media, "") // the first tier, under its own name
		}
		if i < 0 {
			return
		}
		a.media = slices.Delete(a.media, i, i+1)
		if len(a.media) == 0 {
			delete(w.stored, b)
		}
		s.removed(b, e.Medium)
	case e.Op == store.KeyStored && e.Medium != "" && !slices.Contains(a.media, e.Medium):
		// A block announced stored reached another tier.
		a.media = append(a.media, e.Medium)
		s.events = append(s.events, connector.KVEvent{
			Kind: connector.BlockStored, Generation: s.meta.Generation, Group: b.g,
			Hashes: []hashing.BlockHash{b.h}, Parent: a.parent, BlockSize: s.bs, Tokens: a.tokens, Medium: e.Medium,
		})
	}
}

// removed announces that block b left the medium, joining the previous
// event when it is a removal of the same group and medium.
func (s *Planner) removed(b groupHash, medium string) {
	if n := len(s.events); n > 0 {
		last := &s.events[n-1]
		if last.Kind == connector.BlockRemoved && last.Group == b.g && last.Medium == medium && last.Generation == s.meta.Generation {
			last.Hashes = append(last.Hashes, b.h)
			return
		}
	}
	s.events = append(s.events, connector.KVEvent{Kind: connector.BlockRemoved, Generation: s.meta.Generation, Group: b.g, Hashes: []hashing.BlockHash{b.h}, Medium: medium})
}

// announce publishes ev, a BlockStored of the half's own save whose every
// worker stored its blocks. When watching, it remembers the blocks, and a
// block that a key event took away while the save was in flight (or
// whose events were lost) is announced removed right after.
func (s *Planner) announce(ev connector.KVEvent) {
	w := s.w
	if w != nil && len(w.stored)+len(ev.Hashes) > maxTracked {
		s.resync(false)
	}
	s.events = append(s.events, ev)
	if w == nil {
		return
	}
	for i, h := range ev.Hashes {
		b := groupHash{ev.Group, h}
		if !w.land(b) {
			s.removed(b, "")
			continue
		}
		a := w.stored[b]
		if a == nil {
			a = &announced{parent: parentAt(ev.Parent, ev.Hashes, i)}
			if ev.Tokens != nil {
				a.tokens = ev.Tokens[i*s.bs : (i+1)*s.bs : (i+1)*s.bs]
			}
			w.stored[b] = a
		}
		if !slices.Contains(a.media, "") {
			a.media = append(a.media, "")
		}
	}
}
