package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
)

// Store is a key-value store for KV-cache blocks whose values move straight
// between the store and registered memory regions of the caller.
//
// Keys are printable ASCII strings (see [ValidateKey]). A value is the bytes
// of one region, stored whole; a get copies it whole into the caller's region.
//
// Batch calls take one result slot per key, in res (len(res) must equal
// len(keys)); they return a non-nil error only when the call itself failed
// (the store is closed, ctx is done before anything was done, the slices
// disagree in length). Per-key failures go to res[i].Err and never fail the
// call. On a whole-call error the contents of res are unspecified.
//
// Slices passed in are read during the call only and never retained. Values
// are copied into caller memory only: a store never hands out its own memory.
//
// Implementations are safe for concurrent use by multiple goroutines. Every
// method may block on I/O; those that take a context honor its cancellation
// between keys at the least.
type Store interface {
	// Exists looks up each key: res[i].Err is nil when keys[i] is present,
	// [ErrNotFound] when it is absent, another error for that key alone
	// (such as [ErrInvalidKey]). res[i].N is the size in bytes of the value
	// the key holds when present (at least 1, as no value is empty), or 0
	// from a store configured to report presence only, whose doc says so
	// (store/mooncake with Config.PresenceOnly); 0 on error. An exists may
	// grant a read lease on each key it finds (see [Leaser]).
	Exists(ctx context.Context, keys []string, res []Result) error

	// Put stores the bytes of src[i] under keys[i]. A key that is already
	// present keeps its first value and counts as success (first writer
	// wins). On success res[i].N is src[i].Len, the length of the value
	// this call offered, whether the call stored it or found the key
	// present; it is not the size of the value the key holds, which after
	// a put of a present key may differ (Exists or Get report that size).
	// On error res[i].N is 0. Per-key errors: [ErrInvalidKey],
	// [ErrInvalidRegion], [ErrNoSpace] (nothing stored for that key; the
	// caller may retry later).
	//
	// First writer wins within a batch too: a key named more than once in
	// keys is stored from its first occurrence that is stored, and every
	// later occurrence is a put of a present key: its bytes are not kept,
	// and it reports success with res[i].N the length of its own region.
	Put(ctx context.Context, keys []string, src []rdma.Region, res []Result) error

	// Get copies the value of keys[i] into dst[i], from its start. On
	// success res[i].N is the value's size, which is the number of bytes
	// written into dst[i]; the bytes of dst[i] past N are left as they
	// were. On error res[i].N is 0. Per-key errors: [ErrNotFound],
	// [ErrBufferTooSmall] (dst[i] is shorter than the value; dst[i] is not
	// written), [ErrLeaseExpired], [ErrInvalidKey], [ErrInvalidRegion].
	//
	// A key named more than once in keys fills the destination of every
	// occurrence with the value, each occurrence judged on its own: one
	// whose destination is too short gets [ErrBufferTooSmall] and is not
	// written, whatever the others get.
	//
	// A Get that runs while a Remove, RemovePrefix or RemoveAll deletes
	// its key, or while an eviction drops it, reports for that key either
	// the value whole, exactly as it was stored, or [ErrNotFound] (or
	// another per-key error such as [ErrLeaseExpired]). It never reports
	// success with other bytes: not a value torn by a removal, nor another
	// key's value stored in memory freed under the read.
	Get(ctx context.Context, keys []string, dst []rdma.Region, res []Result) error

	// Remove deletes key. It returns [ErrNotFound] if the key is absent.
	//
	// A store that grants read leases (see [Leaser]) does not take a key
	// from under a lease: Remove of a leased key may wait a bounded time
	// (Leases.RemoveWait) for the lease to end, and then fails with an
	// error matching [ErrHasLease], leaving the key whole and readable
	// until a later removal, eviction or the lease's end lets it go.
	// Removal never frees memory a Get is copying out of (see [Store.Get]).
	Remove(ctx context.Context, key string) error

	// RemovePrefix deletes every key that starts with prefix, and returns
	// how many it deleted. An empty prefix is an error: use RemoveAll.
	//
	// A store that grants read leases leaves the keys under a lease in
	// place, whole and readable, as Remove does. It counts only the keys it
	// deleted, and where it can tell that it left some, it also returns an
	// error matching [ErrHasLease] that says how many; the implementation's
	// doc says which it does. Call again once the leases have ended to
	// delete the rest.
	RemovePrefix(ctx context.Context, prefix string) (int, error)

	// RemoveAll deletes every key and returns how many it deleted. Keys
	// under a read lease are left as by RemovePrefix.
	RemoveAll(ctx context.Context) (int, error)

	// Register makes r available as a source or destination of Put and Get.
	// Stores that need no registration accept any valid host region.
	// Registering a region that overlaps a registered one is an error.
	Register(r rdma.Region) error

	// Unregister undoes Register. The region must not be in use by a call.
	Unregister(r rdma.Region) error

	// Stats returns a snapshot of the store's counters.
	Stats() Stats

	// Close releases the store's resources. Later calls return [ErrClosed].
	// Close is idempotent; calls already running finish first.
	Close() error
}

// Vectored is an optional interface of a [Store] whose values can be
// gathered from, and scattered into, several regions per key in one call,
// with no staging copy: a connector stores a block and a short trailer
// after it as one value, although the two live apart in memory.
//
// PutV stores under keys[i] the concatenation of the regions src[i], in
// order, exactly as [Store.Put] would store one region holding those bytes:
// the same first-writer-wins rule and per-key errors, and on success
// res[i].N is the total length of the regions src[i], whether the call
// stored them or found the key present. GetV copies the value of keys[i]
// across the regions dst[i] in order, filling each before the next; on
// success res[i].N is the value's size, the number of bytes written across
// the regions. A value longer than the regions together is
// [ErrBufferTooSmall] and nothing of it is written; a shorter one fills a
// prefix of the regions and leaves the rest unchanged. An empty region list
// for a key is [ErrInvalidRegion] for that key. On error res[i].N is 0.
// len(src) or len(dst) must equal len(keys) ([CheckBatch]).
//
// A value stored with PutV is read back by Get, and a value stored with Put
// by GetV: the grouping of regions is not part of the value. Callers check
// for Vectored once, when they open, and fall back to staging the bytes
// through one region of their own.
type Vectored interface {
	// PutV stores under keys[i] the concatenation of the regions src[i],
	// as [Store.Put] stores one region. The slices are read during the
	// call only; it may be called concurrently with any other call.
	PutV(ctx context.Context, keys []string, src [][]rdma.Region, res []Result) error

	// GetV copies the value of keys[i] across the regions dst[i], as
	// [Store.Get] copies it into one region, including the rules for a
	// repeated key and for a removal in flight. The slices are read during
	// the call only; it may be called concurrently with any other call.
	GetV(ctx context.Context, keys []string, dst [][]rdma.Region, res []Result) error
}

// Leaser is an optional interface of a [Store] that says whether it
// grants read leases, and what its removals do under one: stores differ,
// and the rest of the interface cannot say it. Callers check for Leaser
// once, when they open the store, and read Leases then: it does not change
// for the store's life. A store that does not implement Leaser may grant
// leases or not; callers then assume that it may, for a time they do not
// know, as [Store.Remove] and [Store.RemovePrefix] allow.
type Leaser interface {
	// Leases describes the store's read leases. It neither blocks nor
	// fails, and it may be called concurrently with any call, and after
	// Close.
	Leases() Leases
}

// Leases describes the read leases of a store (see [Leaser]). Its zero
// value is a store that grants none: Remove, RemovePrefix and RemoveAll
// remove every key they name that is present, and never return
// [ErrHasLease].
//
// A read lease is granted on each key that Exists finds, when Exists is
// set, and on each key that Get reads, when Get is set, at some time
// during the call; it lasts TTL from then, and each such call grants it
// anew. While a lease lasts the key stays (in Mooncake it is not evicted
// either): [Store.Remove] of it waits up to RemoveWait for the lease to
// end, and then fails with an error matching [ErrHasLease], leaving the
// key whole and readable; [Store.RemovePrefix] and [Store.RemoveAll] leave
// it in place and do not count it (whether they also return [ErrHasLease]
// is up to the store, as its doc says). A Get of a key whose lease ran out
// during the transfer may fail with [ErrLeaseExpired]. Mooncake Store
// grants a lease on every exists and get, for the master's
// --default_kv_lease_ttl; store/memstore grants none.
type Leases struct {
	// Exists is whether Exists grants a read lease on each key it finds.
	Exists bool
	// Get is whether Get (and GetV) grants a read lease on each key it
	// reads.
	Get bool
	// TTL is how long a lease lasts once granted. Zero, when Exists or
	// Get is set, means that a lease ends with the call that granted it:
	// it holds the key only while the call runs (a Remove waits for a Get
	// copying the key's value, and nothing else).
	TTL time.Duration
	// RemoveWait is the longest that Remove waits for a lease on its key
	// to end before it fails with [ErrHasLease]; zero means it fails at
	// once. A Remove may take longer than RemoveWait by the time of its
	// calls to the store's backend.
	RemoveWait time.Duration
}

// Result is the outcome of one key of a batch call.
//
// N is a number of bytes, and which one depends on the call:
//
//	call          res[i].N on success
//	Exists        the size of the value keys[i] holds (0 from a store that
//	              reports presence only, and says so in its doc)
//	Get, GetV     the size of the value, which is the number of bytes written
//	              into the destination, from its start
//	Put, PutV     the length of the source (src[i].Len, or the total of the
//	              regions src[i]), whether the call stored it or found the
//	              key present; each occurrence of a key repeated in the batch
//	              reports its own source's length
//
// N is 0 whenever Err is not nil. A put does not report the size of the
// value the key holds: after a put of a present key that value is the
// first one stored, which may be of another size. Mooncake Store's put
// reports success for a present key with no sign that it was present, and
// learning the size there costs a request to the master per key (and a
// read lease on it), so no store reports it; a caller that must know asks
// Exists, or checks N of the Get that reads the value.
type Result struct {
	N   int   // bytes: see the table above; 0 on error
	Err error // nil on success; matches one of the package's sentinels
}

// Stats are a store's counters. Fields a store does not track are zero.
type Stats struct {
	Keys         int64 // keys held now
	Bytes        int64 // value bytes held now
	Capacity     int64 // value bytes the store may hold; 0 if unknown
	Hits         int64 // keys found by Get
	Misses       int64 // keys not found by Get
	Exists       int64 // keys probed by Exists
	Puts         int64 // keys stored by Put (not counting first-writer-wins duplicates)
	Duplicates   int64 // puts of keys already present
	RejectedPuts int64 // puts refused for lack of space
	Evictions    int64 // keys evicted to make room
	BytesIn      int64 // bytes copied in by Put
	BytesOut     int64 // bytes copied out by Get
}

// Errors a store returns, per key or per call. They correspond one to one to
// Mooncake Store's codes where Mooncake has one (in parentheses).
var (
	ErrNotFound       = errors.New("store: not found")           // -704 OBJECT_NOT_FOUND
	ErrNoSpace        = errors.New("store: no space")            // -200 NO_AVAILABLE_HANDLE
	ErrLeaseExpired   = errors.New("store: lease expired")       // -707 LEASE_EXPIRED
	ErrHasLease       = errors.New("store: object has a lease")  // -706 OBJECT_HAS_LEASE
	ErrBufferTooSmall = errors.New("store: buffer too small")    // -600 INVALID_PARAMS (get)
	ErrInvalidKey     = errors.New("store: invalid key")         // -600 INVALID_PARAMS (key)
	ErrInvalidRegion  = errors.New("store: invalid region")      // -600 INVALID_PARAMS (buffer)
	ErrClosed         = errors.New("store: closed")              // the store was closed
	ErrUnavailable    = errors.New("store: backend unavailable") // library or service missing
	ErrTransfer       = errors.New("store: transfer failed")     // -800 TRANSFER_FAIL, -900/-901 RPC
)

// MaxKeyLen is the longest key a store must accept, in bytes.
const MaxKeyLen = 512

// ValidateKey reports whether key is a valid store key: 1 to [MaxKeyLen]
// bytes of printable ASCII (0x21 to 0x7e), so no spaces or control bytes.
// The error wraps [ErrInvalidKey] and names the key.
func ValidateKey(key string) error {
	if len(key) == 0 {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key of %d bytes is longer than %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	// Eight bytes at a time: a word is valid when no byte is below 0x21
	// and none above 0x7e (the classic "has less" and "has more" tests).
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(key); i += 8 {
		b := key[i : i+8]
		w := uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
			uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
		below := (w - ones*0x21) &^ w       // some high bit set iff some byte is below 0x21
		above := (w + ones*(0x7f-0x7e)) | w // some high bit set iff some byte is above 0x7e
		if (below|above)&highs != 0 {
			break
		}
	}
	for ; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: key %.64q has byte %#x at %d (printable ASCII without spaces only)", ErrInvalidKey, key, c, i)
		}
	}
	return nil
}

// CheckBatch returns an error when a batch call's slices disagree in
// length: the whole-call error every implementation returns for that.
func CheckBatch(op string, keys int, regions int, res int) error {
	if regions >= 0 && regions != keys {
		return fmt.Errorf("store: %s: %d keys but %d regions", op, keys, regions)
	}
	if res != keys {
		return fmt.Errorf("store: %s: %d keys but %d result slots", op, keys, res)
	}
	return nil
}
