package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// expiryTTL is the time to live that the Expiry subtest asks of the
// stores Options.Expiring returns: short enough to wait out, long enough
// that a put and the calls right after it usually fit in it (when they do
// not, on a slow machine, the check that the keys are present before it
// ends is skipped, never failed).
var expiryTTL = 200 * time.Millisecond

// expiryWait bounds the wait for the store.Watcher events of expired
// keys: generous, as the machine may be slow or busy.
var expiryWait = time.Minute

// expiryPoll is the pause between two takes from a feed while the Expiry
// subtest waits for the events of expired keys.
const expiryPoll = 5 * time.Millisecond

// expiryGroups are the groups of keys of the Expiry subtest: the keys of
// each are first touched, once their time to live has passed, by one
// call, so that a store that expires keys lazily, as a call finds them,
// is held to it in every call.
var expiryGroups = []string{"Get", "Exists", "Batch", "GetV", "Put", "Remove", "RemovePrefix"}

// expiry checks, with a store from Options.Expiring, that keys put are
// present (and whole) until their time to live has passed, as far as the
// harness measured it, and absent after it to every call: Get (nothing
// written), Exists, a batch that mixes them with a present key, GetV, a
// put that stores a new value under an expired key (and Get reads the new
// one), Remove (store.ErrNotFound) and RemovePrefix (nothing counted);
// and that a store.Watcher announces each expired key once, as
// store.KeyExpired.
func (h *harness) expiry(t tester) {
	if h.opts.Expiring == nil {
		t.Skip("storetest: Options.Expiring is nil: the store declares no expiry")
	}
	const per, size = 4, 256
	n := len(expiryGroups) * per
	mem := newMemory(t, n+2, 2*size)
	s := h.openWith(t, func(t testing.TB) store.Store { return h.opts.Expiring(t, expiryTTL) }, mem)
	var feed *store.Feed
	if w, ok := s.(store.Watcher); ok {
		f, err := w.Watch(4096)
		if err != nil {
			t.Fatalf("Watch(4096) = %v, want nil", err)
		}
		defer f.Close()
		feed = f
	}
	keys := make([]string, n)
	vals := make([][]byte, n)
	src := make([]rdma.Region, n)
	group := map[string][]int{}
	for g, name := range expiryGroups {
		for j := range per {
			i := g*per + j
			keys[i] = fmt.Sprintf("expiry@%s@%d", name, j)
			vals[i] = value(keys[i], 1, size-j*17)
			copy(mem.bytes(i), vals[i])
			src[i] = mem.slot(i, len(vals[i]))
			group[name] = append(group[name], i)
		}
	}
	res := make([]store.Result, n)
	putStart := time.Now()
	if err := s.Put(background, keys, src, res); err != nil {
		t.Fatalf("Put of %d keys = %v, want nil", n, err)
	}
	putEnd := time.Now()
	for i, r := range res {
		if r.Err != nil || r.N != len(vals[i]) {
			t.Fatalf("Put(%q) = {N: %d, Err: %v}, want {N: %d}", keys[i], r.N, r.Err, len(vals[i]))
		}
	}
	// Before the time to live has passed: every key present and whole,
	// checked only when the harness saw the get end within it.
	dst := make([]rdma.Region, n)
	for i := range keys {
		dst[i] = mem.slot(i, 2*size)
	}
	if err := s.Get(background, keys, dst, res); err != nil {
		t.Fatalf("Get of %d keys = %v, want nil", n, err)
	}
	if took := time.Since(putStart); took >= expiryTTL {
		t.Logf("the put and the get took %v, more than the time to live of %v: their presence is not checked (the machine is slow)", took.Round(time.Millisecond), expiryTTL)
	} else {
		for i, r := range res {
			if r.Err != nil || r.N != len(vals[i]) || !bytes.Equal(mem.bytes(i)[:r.N], vals[i]) {
				t.Fatalf("Get(%q) %v after its put started, within its time to live of %v = {N: %d, Err: %v}, want its %d-byte value",
					keys[i], took.Round(time.Millisecond), expiryTTL, r.N, r.Err, len(vals[i]))
			}
		}
	}
	// Wait the time to live out, from the end of the put: waiting longer
	// is always right.
	if d := time.Until(putEnd.Add(expiryTTL + time.Millisecond)); d > 0 {
		time.Sleep(d)
	}
	after := fmt.Sprintf("%v after its put returned, past its time to live of %v", expiryTTL, expiryTTL)
	absent := func(call, key string, r store.Result) {
		t.Helper()
		if !errors.Is(r.Err, store.ErrNotFound) {
			t.Errorf("%s(%q) %s = {N: %d, Err: %v}, want store.ErrNotFound: an expired key is absent", call, key, after, r.N, r.Err)
		}
	}
	sub := func(name string) ([]string, []int) {
		idx := group[name]
		ks := make([]string, len(idx))
		for j, i := range idx {
			ks[j] = keys[i]
		}
		return ks, idx
	}
	// Get: nothing found, nothing written.
	ks, idx := sub("Get")
	for j, i := range idx {
		canary(mem.bytes(i))
		dst[j] = mem.slot(i, 2*size)
	}
	if err := s.Get(background, ks, dst[:len(ks)], res[:len(ks)]); err != nil {
		t.Fatalf("Get of %d expired keys = %v, want nil", len(ks), err)
	}
	for j, i := range idx {
		absent("Get", ks[j], res[j])
		if k := canaryBroken(mem.bytes(i), 0); k >= 0 {
			t.Errorf("Get(%q) %s wrote byte %d of its destination", ks[j], after, k)
		}
	}
	// Exists.
	ks, _ = sub("Exists")
	if err := s.Exists(background, ks, res[:len(ks)]); err != nil {
		t.Fatalf("Exists of %d expired keys = %v, want nil", len(ks), err)
	}
	for j, k := range ks {
		absent("Exists", k, res[j])
	}
	// A batch of expired keys and one fresh key: the fresh one is found,
	// the others are not.
	ks, idx = sub("Batch")
	fresh := "expiry@fresh"
	fv := value(fresh, 1, size)
	copy(mem.bytes(n), fv)
	freshStart := time.Now()
	if err := s.Put(background, []string{fresh}, []rdma.Region{mem.slot(n, size)}, res[:1]); err != nil || res[0].Err != nil {
		t.Fatalf("Put(%q) = %v, %v; want nil", fresh, err, res[0].Err)
	}
	bk := append(append([]string{}, ks...), fresh)
	for j, i := range idx {
		canary(mem.bytes(i))
		dst[j] = mem.slot(i, 2*size)
	}
	canary(mem.bytes(n + 1))
	dst[len(ks)] = mem.slot(n+1, 2*size)
	if err := s.Get(background, bk, dst[:len(bk)], res[:len(bk)]); err != nil {
		t.Fatalf("Get of %d expired keys and %q = %v, want nil", len(ks), fresh, err)
	}
	within := time.Since(freshStart) < expiryTTL
	for j, i := range idx {
		absent("Get", ks[j], res[j])
		if k := canaryBroken(mem.bytes(i), 0); k >= 0 {
			t.Errorf("Get(%q) %s, in a batch, wrote byte %d of its destination", ks[j], after, k)
		}
	}
	if r := res[len(ks)]; within && (r.Err != nil || !bytes.Equal(mem.bytes(n + 1)[:r.N], fv)) {
		t.Errorf("Get(%q), put just before, in a batch with expired keys = {N: %d, Err: %v}, want its %d-byte value", fresh, r.N, r.Err, len(fv))
	}
	// GetV, in a store that implements store.Vectored.
	ks, idx = sub("GetV")
	if v, ok := s.(store.Vectored); ok {
		vdst := make([][]rdma.Region, len(ks))
		for j, i := range idx {
			canary(mem.bytes(i))
			vdst[j] = []rdma.Region{mem.subslot(i, 0, size/2), mem.subslot(i, size/2, size+size/2)}
		}
		if err := v.GetV(background, ks, vdst, res[:len(ks)]); err != nil {
			t.Fatalf("GetV of %d expired keys = %v, want nil", len(ks), err)
		}
		for j, i := range idx {
			absent("GetV", ks[j], res[j])
			if k := canaryBroken(mem.bytes(i), 0); k >= 0 {
				t.Errorf("GetV(%q) %s wrote byte %d of its destinations", ks[j], after, k)
			}
		}
	}
	// Put of an expired key stores the new value, and Get reads it.
	ks, idx = sub("Put")
	for j, i := range idx {
		fillValue(mem.bytes(i)[:len(vals[i])], ks[j], 2)
		src[j] = mem.slot(i, len(vals[i]))
	}
	reputStart := time.Now()
	if err := s.Put(background, ks, src[:len(ks)], res[:len(ks)]); err != nil {
		t.Fatalf("Put of %d expired keys = %v, want nil", len(ks), err)
	}
	for j, i := range idx {
		if r := res[j]; r.Err != nil || r.N != len(vals[i]) {
			t.Fatalf("Put(%q) %s = {N: %d, Err: %v}, want {N: %d}", ks[j], after, r.N, r.Err, len(vals[i]))
		}
		canary(mem.bytes(n + 1))
		if err := s.Get(background, ks[j:j+1], []rdma.Region{mem.slot(n+1, 2*size)}, res[j:j+1]); err != nil {
			t.Fatalf("Get(%q) = %v, want nil", ks[j], err)
		}
		if time.Since(reputStart) >= expiryTTL {
			t.Logf("the put of expired keys and the gets after it took more than their time to live: not checked (the machine is slow)")
			break
		}
		want := value(ks[j], 2, len(vals[i]))
		if r := res[j]; r.Err != nil || !bytes.Equal(mem.bytes(n + 1)[:r.N], want) {
			t.Errorf("Get(%q) after a put of the expired key = {N: %d, Err: %v}%s, want the new value put: an expired key does not hold its old value, nor keep out a new one",
				ks[j], r.N, r.Err, firstDiff(want, mem.bytes(n + 1)[:r.N]))
		}
	}
	// Remove: store.ErrNotFound.
	ks, _ = sub("Remove")
	for _, k := range ks {
		if err := s.Remove(background, k); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Remove(%q) %s = %v, want store.ErrNotFound: an expired key is absent", k, after, err)
		}
	}
	// RemovePrefix: nothing counted.
	if got, err := s.RemovePrefix(background, "expiry@RemovePrefix@"); err != nil || got != 0 {
		t.Errorf("RemovePrefix(%q) %s = %d, %v; want 0, nil: expired keys are absent, not removed", "expiry@RemovePrefix@", after, got, err)
	}
	if feed != nil {
		h.expiredEvents(t, feed, keys, s)
	}
}

// expiredEvents waits until feed has announced every key expired, and
// checks that it announced each as store.KeyExpired, and once (but for
// the keys put again, which expire again). Keys whose group no call
// touched after their time to live (GetV, in a store that does not
// implement store.Vectored) are awaited too: a store must expire keys
// nobody asks for.
func (h *harness) expiredEvents(t tester, feed *store.Feed, keys []string, s store.Store) {
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
	}
	gone := map[string][]store.KeyOp{}
	var evs []store.KeyEvent
	deadline := time.Now().Add(expiryWait)
	for {
		var lost int64
		evs, lost = feed.Take(evs[:0])
		if lost > 0 {
			t.Fatalf("the feed of 4096 events lost %d of the Expiry subtest's few events", lost)
		}
		for _, e := range evs {
			if e.Op.Gone() && want[e.Key] {
				gone[e.Key] = append(gone[e.Key], e.Op)
			}
		}
		missing := ""
		for _, k := range keys {
			if ops := gone[k]; len(ops) > 0 && !hasOp(ops, store.KeyExpired) {
				t.Fatalf("store.Watcher announced %q %v, but the key expired: want store.KeyExpired only", k, ops[0])
			}
			if !hasOp(gone[k], store.KeyExpired) {
				missing = k
				break
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store.Watcher: no store.KeyExpired event for %q %v after its time to live of %v ran out (events of the key: %v)", missing, expiryWait, expiryTTL, gone[missing])
		}
		time.Sleep(expiryPoll)
	}
	for _, k := range keys {
		ops := gone[k]
		for _, op := range ops {
			if op != store.KeyExpired {
				t.Errorf("store.Watcher announced %q %v, but the key expired: want store.KeyExpired only", k, op)
			}
		}
		if len(ops) > 1 && !strings.HasPrefix(k, "expiry@Put@") {
			t.Errorf("store.Watcher announced %q gone %d times (%v): a key leaves once", k, len(ops), ops)
		}
	}
}

func hasOp(ops []store.KeyOp, op store.KeyOp) bool {
	for _, o := range ops {
		if o == op {
			return true
		}
	}
	return false
}
