package store

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Watcher is an optional interface of a [Store] that reports the keys that
// leave it (evicted, removed, expired) and, for a store whose doc says so
// (a store in tiers), the keys that reach one of its tiers. KV-aware
// routers need both: a router that is never told of an eviction keeps
// sending prefixes to an engine whose store no longer holds them.
//
// Callers check for Watcher once, when they open the store. A store that
// does not implement it cannot say what left it; its doc says what it can
// and cannot see.
type Watcher interface {
	// Watch starts a feed of the store's key events from this call on.
	// The feed holds up to n events that its reader has not taken (n >= 1;
	// at most [MaxWatch]); the store never blocks on a slow reader: an
	// event that finds the feed full is dropped and counted, and the
	// reader learns of it from [Feed.Take] (see there). It may be called
	// concurrently with any call. After Close it returns [ErrClosed].
	Watch(n int) (*Feed, error)
}

// MaxWatch is the largest buffer a [Watcher.Watch] takes: 1 << 24 events.
const MaxWatch = 1 << 24

// KeyOp is what happened to a key in a [KeyEvent].
type KeyOp uint8

const (
	KeyStored  KeyOp = iota + 1 // the key reached the store (or the tier Medium names)
	KeyEvicted                  // the store dropped the key to make room
	KeyRemoved                  // Remove, RemovePrefix or RemoveAll deleted the key
	KeyExpired                  // the key's time to live ran out
)

func (op KeyOp) String() string {
	switch op {
	case KeyStored:
		return "stored"
	case KeyEvicted:
		return "evicted"
	case KeyRemoved:
		return "removed"
	case KeyExpired:
		return "expired"
	}
	return fmt.Sprintf("KeyOp(%d)", uint8(op))
}

// Gone reports whether op is one by which a key left the store.
func (op KeyOp) Gone() bool { return op == KeyEvicted || op == KeyRemoved || op == KeyExpired }

// KeyEvent is one key that reached or left a store, as a [Feed] reports it.
type KeyEvent struct {
	Key string
	Op  KeyOp
	// Medium names the tier of a store in tiers that the key reached or
	// left, in vLLM's KV-event vocabulary ("CPU", "DISK", "STORAGE"); it
	// is empty from a store of one tier, whose reader knows its medium.
	Medium string
}

// Feed is a bounded queue of a store's [KeyEvent]s, filled by the store and
// drained by one reader with [Feed.Take]. Stores make feeds with
// [Feeds.Watch]; readers get them from [Watcher.Watch]. It is safe for
// concurrent use: the store adds while the reader takes.
type Feed struct {
	owner *Feeds
	mu    struct {
		sync.Mutex
		buf    []KeyEvent // a ring of cap n
		head   int        // index of the oldest event
		n      int        // events held
		lost   int64      // events dropped since the last Take
		closed bool
	}
	dropped atomic.Int64 // events dropped over the feed's life
}

// Take appends the events held, oldest first, to dst and returns it, with
// the number of events that were dropped since the last Take because the
// feed was full. When lost > 0 the reader's picture of the store is
// incomplete from then on: it must resynchronise (a connector announces
// that every block is cleared, as vLLM's AllBlocksCleared event, and
// counts it). The events returned are those that fitted, in order; the
// dropped ones came after them. Take never blocks on the store.
func (f *Feed) Take(dst []KeyEvent) (_ []KeyEvent, lost int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := 0; i < f.mu.n; i++ {
		j := (f.mu.head + i) % len(f.mu.buf)
		dst = append(dst, f.mu.buf[j])
		f.mu.buf[j] = KeyEvent{}
	}
	f.mu.head, f.mu.n = 0, 0
	lost, f.mu.lost = f.mu.lost, 0
	return dst, lost
}

// Dropped returns how many events the feed dropped over its life because
// it was full.
func (f *Feed) Dropped() int64 { return f.dropped.Load() }

// Close ends the feed: the store stops adding to it and forgets it. Events
// still held can be taken after Close. Close is idempotent.
func (f *Feed) Close() {
	f.mu.Lock()
	already := f.mu.closed
	f.mu.closed = true
	f.mu.Unlock()
	if !already && f.owner != nil {
		f.owner.drop(f)
	}
}

// add queues e, or drops and counts it when the feed is full or closed.
func (f *Feed) add(e KeyEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mu.closed {
		return
	}
	if f.mu.n == len(f.mu.buf) {
		f.mu.lost++
		f.dropped.Add(1)
		return
	}
	f.mu.buf[(f.mu.head+f.mu.n)%len(f.mu.buf)] = e
	f.mu.n++
}

// Feeds is the set of [Feed]s of one store: what an implementation of
// [Watcher] embeds. Its zero value has no feeds; [Feeds.Announce] then
// costs one atomic load, so a store announces every event whether or not
// anybody watches. It is safe for concurrent use.
type Feeds struct {
	count atomic.Int32
	mu    struct {
		sync.Mutex
		list   []*Feed
		closed bool
	}
}

// Watch implements [Watcher.Watch] for the store that owns fs.
func (fs *Feeds) Watch(n int) (*Feed, error) {
	if n < 1 || n > MaxWatch {
		return nil, fmt.Errorf("store: watch: buffer of %d events is outside [1, %d]", n, MaxWatch)
	}
	f := &Feed{owner: fs}
	f.mu.buf = make([]KeyEvent, n)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.mu.closed {
		return nil, fmt.Errorf("store: watch: %w", ErrClosed)
	}
	fs.mu.list = append(fs.mu.list, f)
	fs.count.Store(int32(len(fs.mu.list)))
	return f, nil
}

// Watching reports whether any feed is open: a store may skip building
// events nobody reads.
func (fs *Feeds) Watching() bool { return fs.count.Load() > 0 }

// Announce adds e to every open feed. It never blocks on a reader.
func (fs *Feeds) Announce(e KeyEvent) {
	if fs.count.Load() == 0 {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, f := range fs.mu.list {
		f.add(e)
	}
}

// Close closes every feed and refuses later watches: the store's Close
// calls it. Events already held stay takeable.
func (fs *Feeds) Close() {
	fs.mu.Lock()
	list := fs.mu.list
	fs.mu.list = nil
	fs.mu.closed = true
	fs.count.Store(0)
	fs.mu.Unlock()
	for _, f := range list {
		f.mu.Lock()
		f.mu.closed = true
		f.mu.Unlock()
	}
}

// Lost counts n events as dropped on every open feed, as if each had been
// full: their readers learn of it from [Feed.Take] and resynchronise. A
// store that relays the events of others (a store in tiers) calls it when
// a feed it reads lost events.
func (fs *Feeds) Lost(n int64) {
	if n <= 0 || fs.count.Load() == 0 {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, f := range fs.mu.list {
		f.mu.Lock()
		if !f.mu.closed {
			f.mu.lost += n
			f.dropped.Add(n)
		}
		f.mu.Unlock()
	}
}

func (fs *Feeds) drop(f *Feed) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for i, g := range fs.mu.list {
		if g == f {
			fs.mu.list = append(fs.mu.list[:i], fs.mu.list[i+1:]...)
			break
		}
	}
	fs.count.Store(int32(len(fs.mu.list)))
}
