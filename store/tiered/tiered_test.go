package tiered_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/diskstore"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/tiered"
)

var bg = context.Background()

func host(t testing.TB, n int) rdma.Region {
	t.Helper()
	m, err := rdma.AllocHost(n)
	if err != nil {
		t.Skipf("host memory: %v", err)
	}
	t.Cleanup(func() { m.Free() })
	return m.Region()
}

func fill(r rdma.Region, i int) rdma.Region {
	for j, b := 0, r.Bytes(); j < len(b); j++ {
		b[j] = byte(i*31 + j)
	}
	return r
}

// ramDisk returns a Store of a memstore of ram bytes over a diskstore,
// and the two tiers.
func ramDisk(t testing.TB, ram int64, cfg tiered.Config, filter bool) (*tiered.Store, *memstore.Store, *diskstore.Store) {
	t.Helper()
	disk := openDisk(t, diskstore.Config{Dir: t.TempDir(), Capacity: 64 << 20, SegmentSize: 1 << 20})
	mem, err := memstore.New(memstore.Config{Capacity: ram, Shards: 1})
	if err != nil {
		disk.Close()
		t.Fatal(err)
	}
	cfg.Tiers = []tiered.Tier{{Store: mem, Medium: tiered.MediumCPU}, {Store: disk, Medium: tiered.MediumDisk, Filter: filter}}
	s, err := tiered.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, mem, disk
}

func putKeys(t testing.TB, s store.Store, src rdma.Region, keys ...string) {
	t.Helper()
	res := make([]store.Result, len(keys))
	srcs := make([]rdma.Region, len(keys))
	for i := range srcs {
		srcs[i] = src
	}
	if err := s.Put(bg, keys, srcs, res); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("Put(%q) = %v", keys[i], r.Err)
		}
	}
}

func getKey(t testing.TB, s store.Store, key string, dst rdma.Region) error {
	t.Helper()
	res := []store.Result{{}}
	if err := s.Get(bg, []string{key}, []rdma.Region{dst}, res); err != nil {
		t.Fatal(err)
	}
	return res[0].Err
}

func has(t testing.TB, s store.Store, key string) bool {
	t.Helper()
	res := []store.Result{{}}
	if err := s.Exists(bg, []string{key}, res); err != nil {
		t.Fatal(err)
	}
	return res[0].Err == nil
}

// TestPromotion evicts keys from a small RAM tier and reads them again:
// they come from the disk tier, are promoted, and the next read hits RAM.
// The feed reports each key stored in both tiers, the RAM tier's
// evictions (memstore's, when memstore reports them) and the promotions,
// with the tiers' media.
func TestPromotion(t *testing.T) {
	s, mem, _ := ramDisk(t, 64<<10, tiered.Config{}, false)
	feed, err := s.Watch(1 << 12)
	if err != nil {
		t.Fatal(err)
	}
	src, dst := host(t, 8<<10), host(t, 8<<10)
	for i := range 32 { // 256 KiB through a 64 KiB RAM tier
		putKeys(t, s, fill(src, i), fmt.Sprintf("k%d", i))
	}
	if has(t, mem, "k0") {
		t.Fatal("k0 is still in the RAM tier after 256 KiB went through it; the test needs it evicted")
	}
	if err := getKey(t, s, "k0", dst); err != nil || !bytes.Equal(dst.Bytes(), fill(src, 0).Bytes()) {
		t.Fatalf("Get(k0) = %v, or not its value", err)
	}
	if !has(t, mem, "k0") {
		t.Errorf("k0 is not in the RAM tier after a Get promoted it")
	}
	ts := s.Tiers()
	if ts[1].Hits != 1 || ts[0].Promotions != 1 || ts[1].Demotions != 32 {
		t.Errorf("Tiers() = %+v; want 1 disk hit, 1 promotion into RAM, 32 demotions into disk", ts)
	}
	if err := getKey(t, s, "k0", dst); err != nil {
		t.Fatal(err)
	}
	if ts := s.Tiers(); ts[0].Hits != 1 {
		t.Errorf("after a second Get, RAM hits = %d, want 1", ts[0].Hits)
	}
	evs, lost := feed.Take(nil)
	count := map[string]int{}
	for _, e := range evs {
		count[e.Medium+" "+e.Op.String()]++
	}
	if lost != 0 || count["CPU stored"] != 33 || count["DISK stored"] != 32 {
		t.Errorf("feed: %v, %d lost; want 33 CPU stored (32 puts, 1 promotion), 32 DISK stored", count, lost)
	}
	if _, ok := any(mem).(store.Watcher); ok && count["CPU evicted"] == 0 {
		t.Errorf("feed: %v; want the RAM tier's evictions", count)
	}
	if err := s.Remove(bg, "k0"); err != nil {
		t.Fatal(err)
	}
	evs, _ = feed.Take(evs[:0])
	var removed []string
	for _, e := range evs {
		removed = append(removed, e.Medium+" "+e.Op.String()+" "+e.Key)
	}
	if strings.Join(removed, ",") != "CPU removed k0,DISK removed k0" {
		t.Errorf("feed after Remove(k0): %v, want k0 removed from CPU and DISK", removed)
	}
}

// TestFilter keeps keys put once off the filtered disk tier, and copies a
// key down once a Get makes it used twice.
func TestFilter(t *testing.T) {
	s, mem, disk := ramDisk(t, 1<<20, tiered.Config{}, true)
	src, dst := host(t, 4096), host(t, 4096)
	putKeys(t, s, fill(src, 1), "once", "twice")
	if has(t, disk, "once") || has(t, disk, "twice") {
		t.Fatal("a key put once reached the filtered disk tier")
	}
	if err := getKey(t, s, "twice", dst); err != nil {
		t.Fatal(err)
	}
	if !has(t, disk, "twice") || has(t, disk, "once") {
		t.Errorf("after a Get of twice: on disk: twice %v, once %v; want true, false", has(t, disk, "twice"), has(t, disk, "once"))
	}
	if !has(t, mem, "once") {
		t.Error("the RAM tier lost a key")
	}
	if ts := s.Tiers(); ts[1].Filtered != 2 || ts[1].Demotions != 1 {
		t.Errorf("disk tier: %+v; want 2 filtered, 1 demotion", ts[1])
	}
}

// TestWriteBack puts into the RAM tier and waits for the values to reach
// the disk tier.
func TestWriteBack(t *testing.T) {
	s, _, disk := ramDisk(t, 1<<20, tiered.Config{WriteBack: true}, false)
	src := host(t, 4096)
	var keys []string
	for i := range 20 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	putKeys(t, s, fill(src, 2), keys...)
	ctx, cancel := context.WithTimeout(bg, time.Minute)
	defer cancel()
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("Flush() = %v: the write-back of 20 keys did not end in a minute: %+v", err, s.Tiers())
	}
	for _, k := range keys {
		if !has(t, disk, k) {
			t.Errorf("%s not written back to the disk tier", k)
		}
	}
	dst := host(t, 4096)
	res := []store.Result{{}}
	if err := disk.Get(bg, []string{"k7"}, []rdma.Region{dst}, res); err != nil || res[0].Err != nil || !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Errorf("the disk tier's k7 = %v, %v, or not the value put", err, res[0].Err)
	}
}

// TestTierFails serves a key from the disk tier when the RAM tier's store
// is closed under it, and reports store.ErrNotFound naming the tier when
// neither has it.
func TestTierFails(t *testing.T) {
	s, mem, _ := ramDisk(t, 1<<20, tiered.Config{NoPromote: true}, false)
	src, dst := host(t, 4096), host(t, 4096)
	putKeys(t, s, fill(src, 3), "k")
	mem.Close()
	if err := getKey(t, s, "k", dst); err != nil || !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Errorf("Get(k) with the RAM tier closed = %v, want the disk tier's value", err)
	}
	err := getKey(t, s, "absent", dst)
	if !errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), "CPU") {
		t.Errorf("Get(absent) = %v, want store.ErrNotFound naming the failed CPU tier", err)
	}
}

// TestConfig refuses configurations out of range, naming the field.
func TestConfig(t *testing.T) {
	mem, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	for _, tc := range []struct {
		cfg   tiered.Config
		field string
	}{
		{tiered.Config{}, "Tiers"},
		{tiered.Config{Tiers: []tiered.Tier{{Medium: "CPU"}}}, "Tiers[0].Store"},
		{tiered.Config{Tiers: []tiered.Tier{{Store: mem}}}, "Tiers[0].Medium"},
		{tiered.Config{Tiers: []tiered.Tier{{Store: mem, Medium: "CPU", Filter: true}}}, "Tiers[0].Filter"},
		{tiered.Config{Tiers: []tiered.Tier{{Store: mem, Medium: "CPU"}}, MinUses: 99}, "MinUses"},
	} {
		if _, err := tiered.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
}

// openDisk opens a diskstore, or skips the test where diskstore does not
// run.
func openDisk(t testing.TB, cfg diskstore.Config) *diskstore.Store {
	t.Helper()
	s, err := diskstore.Open(cfg)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("diskstore: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pausedGets is a store whose gets, once armed, read their values and then
// wait for release before they return.
type pausedGets struct {
	store.Store
	armed   chan struct{} // closed to arm
	read    chan struct{} // closed once an armed get has read
	release chan struct{}
}

func (p *pausedGets) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	err := p.Store.Get(ctx, keys, dst, res)
	select {
	case <-p.armed:
		close(p.read)
		<-p.release
	default:
	}
	return err
}

// TestNoStalePromotion: a Get that read a key's old value from the lower
// tier, while the key was removed and put again with a new value (which
// then left the RAM tier), does not promote the old value over the new
// one.
func TestNoStalePromotion(t *testing.T) {
	low, err := memstore.New(memstore.Config{Capacity: 1 << 20, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	ram, err := memstore.New(memstore.Config{Capacity: 1 << 20, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	paused := &pausedGets{Store: low, armed: make(chan struct{}), read: make(chan struct{}), release: make(chan struct{})}
	s, err := tiered.New(tiered.Config{Tiers: []tiered.Tier{{Store: ram, Medium: tiered.MediumCPU}, {Store: paused, Medium: tiered.MediumDisk}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	const key = "k"
	v1, v2, dst := fill(host(t, 4096), 1), fill(host(t, 4096), 2), host(t, 4096)
	putKeys(t, s, v1, key)
	if err := ram.Remove(bg, key); err != nil { // only the lower tier holds v1
		t.Fatal(err)
	}
	close(paused.armed)
	got := make(chan error, 1)
	go func() { got <- getKey(t, s, key, dst) }()
	select {
	case <-paused.read:
	case <-time.After(time.Minute):
		t.Fatal("the Get did not read the lower tier in a minute")
	}
	// While the Get holds v1: remove, put v2, and v2 leaves the RAM tier.
	paused.armed = make(chan struct{}) // disarmed for what follows
	if err := s.Remove(bg, key); err != nil {
		t.Fatal(err)
	}
	putKeys(t, s, v2, key)
	if err := ram.Remove(bg, key); err != nil {
		t.Fatal(err)
	}
	close(paused.release)
	if err := <-got; err != nil {
		t.Fatalf("the Get = %v", err)
	}
	if !bytes.Equal(dst.Bytes(), v1.Bytes()) {
		t.Fatalf("the Get did not read the value it was held on")
	}
	clear(dst.Bytes())
	if err := getKey(t, s, key, dst); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.Bytes(), v2.Bytes()) {
		t.Fatalf("a Get after the put of the new value read the old one: a Get that read it before the removal promoted it over the new one")
	}
}

// inFlight is a tier store whose put, once armed, waits for release
// after it entered, and whose gets say when they are called.
type inFlight struct {
	store.Store
	once    sync.Once
	armed   atomic.Bool
	entered chan struct{} // closed once an armed put waits
	release chan struct{}
	gets    chan struct{} // a value per get, while armed
}

func (f *inFlight) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	if f.armed.Load() {
		f.once.Do(func() {
			close(f.entered)
			<-f.release
		})
	}
	return f.Store.Put(ctx, keys, src, res)
}

// Get and Exists send on gets once they have looked, while armed.
func (f *inFlight) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	defer f.looked()
	return f.Store.Get(ctx, keys, dst, res)
}

func (f *inFlight) Exists(ctx context.Context, keys []string, res []store.Result) error {
	defer f.looked()
	return f.Store.Exists(ctx, keys, res)
}

func (f *inFlight) looked() {
	if f.armed.Load() {
		select {
		case f.gets <- struct{}{}:
		default:
		}
	}
}

// failingGets is a tier store whose gets and exists fail (ErrTransfer),
// or, with lost, miss every key (as if it had evicted them), once armed.
type failingGets struct {
	store.Store
	armed atomic.Bool
	lost  bool
}

func (f *failingGets) fail(res []store.Result) bool {
	if !f.armed.Load() {
		return false
	}
	for i := range res {
		res[i] = store.Result{Err: store.ErrTransfer}
		if f.lost {
			res[i] = store.Result{Err: store.ErrNotFound}
		}
	}
	return true
}

func (f *failingGets) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	if f.fail(res) {
		return nil
	}
	return f.Store.Get(ctx, keys, dst, res)
}

func (f *failingGets) Exists(ctx context.Context, keys []string, res []store.Result) error {
	if f.fail(res) {
		return nil
	}
	return f.Store.Exists(ctx, keys, res)
}

// TestMissConfirmedUnderPut: while a write-through put has stored a key
// in the top tier and not yet below, a Get or an Exists whose top tier
// fails it, or no longer has it (evicted), and whose lower tier misses
// does not answer a miss: it waits for the put. Such a wait ends with the
// call's context; and a call that misses another key does not wait.
func TestMissConfirmedUnderPut(t *testing.T) {
	for _, how := range []string{"", "Canceled", "OtherKey"} {
		for _, lost := range []bool{false, true} {
			for _, op := range []string{"Get", "Exists"} {
				name := op + "/TopFails"
				if lost {
					name = op + "/TopLostIt"
				}
				if how != "" {
					name += "/" + how
				}
				t.Run(name, func(t *testing.T) { missConfirmedUnderPut(t, op, lost, how) })
			}
		}
	}
}

func missConfirmedUnderPut(t *testing.T, op string, lost bool, how string) {
	ramStore, err := memstore.New(memstore.Config{Capacity: 1 << 20, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	lowStore, err := memstore.New(memstore.Config{Capacity: 1 << 20, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	ram := &failingGets{Store: ramStore, lost: lost}
	low := &inFlight{Store: lowStore, entered: make(chan struct{}), release: make(chan struct{}), gets: make(chan struct{}, 1)}
	s, err := tiered.New(tiered.Config{Tiers: []tiered.Tier{{Store: ram, Medium: tiered.MediumCPU}, {Store: low, Medium: tiered.MediumDisk}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	const key = "k"
	src, dst := fill(host(t, 4096), 1), host(t, 4096)
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(low.release) }) }
	putDone := make(chan struct{})
	t.Cleanup(func() { // before the memory is freed, on a failure too
		release()
		<-putDone
	})
	low.armed.Store(true)
	put := make(chan error, 1)
	go func() {
		defer close(putDone)
		res := []store.Result{{}}
		err := s.Put(bg, []string{key}, []rdma.Region{src}, res)
		put <- errors.Join(err, res[0].Err)
	}()
	select {
	case <-low.entered:
	case <-time.After(time.Minute):
		t.Fatal("the put did not reach the lower tier in a minute")
	}
	select {
	case <-low.gets: // the put's own look for the key
	default:
	}
	ram.armed.Store(true)
	got := make(chan error, 1)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	asked := key
	if how == "OtherKey" {
		asked = "other"
	}
	go func() {
		res := []store.Result{{}}
		var err error
		if op == "Get" {
			err = s.Get(ctx, []string{asked}, []rdma.Region{dst}, res)
		} else {
			err = s.Exists(ctx, []string{asked}, res)
		}
		got <- errors.Join(err, res[0].Err)
	}()
	// Once the call looked in the lower tier (and missed), the put goes on.
	select {
	case <-low.gets:
	case <-time.After(time.Minute):
		t.Fatalf("the %s did not look in the lower tier in a minute", op)
	}
	if how != "" {
		// Canceled: the call, waiting for the put, ends with its context.
		// OtherKey: a miss of a key with no put in flight does not wait.
		want, what := error(store.ErrNotFound), op+" of another key while a put was in flight"
		if how == "Canceled" {
			cancel()
			want, what = context.Canceled, op+" canceled while it waited for a put in flight"
		}
		select {
		case err := <-got:
			if !errors.Is(err, want) {
				t.Fatalf("%s = %v, want %v", what, err, want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s had not returned a minute later", what)
		}
		release()
		if err := <-put; err != nil {
			t.Fatalf("Put = %v", err)
		}
		return
	}
	release()
	if err := <-put; err != nil {
		t.Fatalf("Put = %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("%s while the put was in flight = %v: the key was in the top tier, which failed it or lost it since; the call must wait for the put, not answer a miss", op, err)
	}
	if op == "Get" && !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("the Get read other bytes than the put's")
	}
}
