package diskstore

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/maphash"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvconnect/kvconnect/internal/regset"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

var (
	_ store.Store    = (*Store)(nil)
	_ store.Vectored = (*Store)(nil)
	_ store.Leaser   = (*Store)(nil)
	_ store.Watcher  = (*Store)(nil)
)

var (
	errWouldBlock = errors.New("diskstore: lock held")
	errShort      = errors.New("diskstore: end of file")
)

// Store is a persistent store of values in segment files on a local
// directory. Open one with [Open]; it is safe for concurrent use.
type Store struct {
	cfg    Config
	log    *slog.Logger
	lock   *os.File
	seed   maphash.Seed
	direct bool // the file system takes O_DIRECT reads
	feeds  store.Feeds
	regs   regset.Set
	hdrs   sync.Pool // *[]byte of hdrBufSize bytes, page-aligned

	// writev is the vectored write of a segment; tests replace it to
	// inject errors (a full disk).
	writev func(f *os.File, bufs [][]byte, off int64) (int, error)

	life struct {
		sync.RWMutex
		closed bool
	}

	// closes are the closes of evicted segments' files running on
	// goroutines of their own (see closeLater), each done channel closed
	// when its files are: a write that finds the disk full waits for
	// them, and so does Close. ended counts the closes that ended.
	closes struct {
		sync.Mutex
		running map[*segment]chan struct{}
		ended   uint64
	}

	// closeHook, when set (by tests), runs on a close's goroutine before
	// the files are closed.
	closeHook func()

	mu struct {
		sync.Mutex
		index   map[uint64]loc
		pending map[uint64]struct{} // keys being written by a put
		segs    map[uint32]*segment
		order   []*segment // oldest first; the last is the active one
		nextID  uint32
		used    int64 // bytes of segment files, the active one's reserved bytes included
		keys    int64
		bytes   int64
		clearAt pos // the position of the latest clear record
	}

	counters struct {
		hits, misses, exists, puts, dups, rejected, evictions, bytesIn, bytesOut atomic.Int64
		direct, buffered, corrupt, skipped, skippedBytes                         atomic.Int64
	}
}

// loc is where the index finds a value: 16 bytes per key. The key itself
// lives only on disk; the index holds a 64-bit hash of it as the map key
// and 16 more bits of another hash here, and a Get compares the key
// stored in the record's header with the one asked for.
type loc struct {
	seg  uint32
	off  uint32
	size uint32
	h2   uint16
	klen uint16
}

// pos orders records: by segment, then offset.
type pos struct{ seg, off uint32 }

func (p pos) less(q pos) bool { return p.seg < q.seg || p.seg == q.seg && p.off < q.off }

func (l loc) pos() pos { return pos{l.seg, l.off} }

// segment is one segment file. Its fields other than the files, id and
// path are guarded by Store.mu.
type segment struct {
	id   uint32
	path string
	f    *os.File // read and write
	df   *os.File // O_DIRECT reads; nil without direct I/O
	end  int64    // bytes appended or reserved
	keys []uint64 // index keys of the values written in it, some since removed: what its eviction drops
	pins int      // calls reading or writing the files now
	dead bool     // evicted: the files close with the last unpin
}

// hdrBufSize holds the header and key of a record with the padding up to
// its value, from the page the record starts in: three pages.
const hdrBufSize = 3 * pageSize

// Open opens the store on cfg.Dir, creating the directory if needed, and
// rebuilds the index from the segment files there: a restarted process
// finds the values its predecessor stored. It takes the directory's lock
// file; a second Open of the same directory, from this process or
// another, fails with an error naming the holder's process id. Records
// that cannot be read back whole (a write torn by a crash, damaged bytes)
// are skipped and counted in [Store.IO]; their values are never served.
func Open(cfg Config) (*Store, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !supported {
		return nil, fmt.Errorf("diskstore: open %s: %w", cfg.Dir, errors.ErrUnsupported)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("diskstore: open: %w", err)
	}
	lock, err := takeLock(cfg.Dir)
	if err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, log: cfg.Logger, lock: lock, seed: maphash.MakeSeed(), writev: writeFile}
	s.hdrs.New = func() any {
		b := make([]byte, hdrBufSize+pageSize)
		a := (pageSize - int(sliceAddr(b)%pageSize)) % pageSize
		b = b[a : a+hdrBufSize]
		return &b
	}
	s.mu.index = make(map[uint64]loc)
	s.mu.pending = make(map[uint64]struct{})
	s.mu.segs = make(map[uint32]*segment)
	if !cfg.Buffered {
		s.direct = probeDirect(cfg.Dir)
	}
	if err := s.recover(); err != nil {
		s.closeFiles()
		return nil, err
	}
	s.mu.Lock()
	gone, err := s.roll()
	s.mu.Unlock()
	s.announceGone(gone) // unpins what the roll evicted, also when it failed
	if err != nil {
		s.closeFiles()
		return nil, err
	}
	return s, nil
}

func writeFile(f *os.File, bufs [][]byte, off int64) (int, error) { return vecIO(true, f, bufs, off) }

// takeLock creates and locks Dir/LOCK, and writes this process's id in it.
func takeLock(dir string) (*os.File, error) {
	path := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("diskstore: open: %w", err)
	}
	if err := lockFile(f); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, errWouldBlock) {
			return nil, fmt.Errorf("diskstore: open %s: the directory is in use by process %s (it holds %s)", dir, strings.TrimSpace(string(holder)), path)
		}
		return nil, fmt.Errorf("diskstore: open %s: lock %s: %w", dir, path, err)
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, fmt.Errorf("diskstore: open %s: %w", dir, err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("diskstore: open %s: %w", dir, err)
	}
	return f, nil
}

// probeDirect reports whether files in dir can be opened for direct I/O.
func probeDirect(dir string) bool {
	path := filepath.Join(dir, "DIRECT-PROBE")
	f, err := os.Create(path)
	if err != nil {
		return false
	}
	f.Close()
	defer os.Remove(path)
	df, err := openDirect(path)
	if err != nil {
		return false
	}
	df.Close()
	return true
}

func segName(id uint32) string { return fmt.Sprintf("%010d.seg", id) }

// hash returns the index key of key and the check bits kept in its loc.
func (s *Store) hash(key string) (uint64, uint16) {
	return mix(maphash.String(s.seed, key))
}

// mix returns h and 16 check bits from a second mix of it: enough to
// tell apart keys whose 64-bit hashes collide, which the index then
// refuses to hold both of.
func mix(h uint64) (uint64, uint16) {
	x := h ^ h>>29
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 32
	return h, uint16(x)
}

// hashBytes is hash of a key in a byte slice.
func (s *Store) hashBytes(key []byte) (uint64, uint16) {
	return mix(maphash.Bytes(s.seed, key))
}

func (s *Store) enter() error {
	s.life.RLock()
	if s.life.closed {
		s.life.RUnlock()
		return store.ErrClosed
	}
	return nil
}

func (s *Store) exit() { s.life.RUnlock() }

func (s *Store) start(ctx context.Context, op string, keys, regions, res int) error {
	if err := store.CheckBatch(op, keys, regions, res); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.enter()
}

// roll starts a new active segment, deleting the oldest ones first while
// the files would take more than the capacity. The caller holds mu; the
// keys the deleted segments held are returned, to announce once mu is
// released.
func (s *Store) roll() ([]goneSeg, error) {
	if n := len(s.mu.order); n > 0 {
		a := s.mu.order[n-1]
		s.mu.used += a.end - s.cfg.SegmentSize // the active one's reservation becomes its size
	}
	var gone []goneSeg
	for s.mu.used+s.cfg.SegmentSize > s.cfg.Capacity && len(s.mu.order) > 0 {
		gone = append(gone, s.evictOldest())
	}
	id := s.mu.nextID
	path := filepath.Join(s.cfg.Dir, segName(id))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return gone, fmt.Errorf("diskstore: new segment: %w", err)
	}
	seg := &segment{id: id, path: path, f: f}
	if s.direct {
		if seg.df, err = openDirect(path); err != nil {
			seg.df = nil
		}
	}
	s.mu.nextID++
	s.mu.segs[id] = seg
	s.mu.order = append(s.mu.order, seg)
	s.mu.used += s.cfg.SegmentSize
	return gone, nil
}

// goneSeg is an evicted segment, pinned, and the records of it that the
// index held, for announcing.
type goneSeg struct {
	seg  *segment
	locs []loc
}

// evictOldest deletes the oldest segment and drops its values from the
// index. The caller holds mu. The segment's file is unlinked now and
// closed when the last call reading it ends: a Get that is copying a value
// out of it finishes with the value whole.
func (s *Store) evictOldest() goneSeg {
	seg := s.mu.order[0]
	s.mu.order = s.mu.order[1:]
	delete(s.mu.segs, seg.id)
	if len(s.mu.order) == 0 {
		s.mu.used = 0
	} else {
		s.mu.used -= seg.end
	}
	g := goneSeg{seg: seg}
	// The segment lists the keys of its values (8 bytes a key), so that
	// its eviction looks up those, not the whole index. A key listed
	// that now lives elsewhere, or nowhere, is left alone.
	n := int64(0)
	for _, h := range seg.keys {
		l, ok := s.mu.index[h]
		if !ok || l.seg != seg.id {
			continue
		}
		delete(s.mu.index, h)
		n++
		s.mu.bytes -= int64(l.size)
		if s.feeds.Watching() {
			g.locs = append(g.locs, l)
		}
	}
	s.mu.keys -= n
	s.counters.evictions.Add(n)
	seg.keys = nil
	seg.dead = true
	if err := os.Remove(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("diskstore: delete evicted segment", "file", seg.path, "err", err)
	}
	seg.pins++ // held until announced
	return g
}

// announceGone reports the keys of evicted segments and unpins them. It
// is called with mu not held.
func (s *Store) announceGone(gone []goneSeg) {
	for _, g := range gone {
		for _, l := range g.locs {
			if key, err := s.readKey(g.seg, l); err == nil {
				s.feeds.Announce(store.KeyEvent{Key: key, Op: store.KeyEvicted})
			}
		}
		s.unpin(g.seg)
	}
}

// readKey reads the key of the record at l from seg, which is pinned.
func (s *Store) readKey(seg *segment, l loc) (string, error) {
	b := make([]byte, headerSize+int(l.klen))
	if _, err := vecIO(false, seg.f, [][]byte{b}, int64(l.off)); err != nil {
		return "", err
	}
	return string(b[headerSize:]), nil
}

func (s *Store) unpin(seg *segment) {
	s.mu.Lock()
	seg.pins--
	closeNow := seg.dead && seg.pins == 0
	s.mu.Unlock()
	if closeNow {
		s.closeLater(seg)
	}
}

// closeLater closes the files of seg, evicted and no longer read, on a
// goroutine of its own. The last close of a deleted file frees its pages
// in the page cache and its blocks on disk: about a millisecond per 8 MiB
// cached, tens of milliseconds for a segment of 256 MiB. The call that
// let go of the segment last (the put whose roll evicted it, or the get
// or put that used it last) does not wait for that; a write that finds
// the disk full does (see write).
func (s *Store) closeLater(seg *segment) {
	done := make(chan struct{})
	s.closes.Lock()
	if s.closes.running == nil {
		s.closes.running = make(map[*segment]chan struct{})
	}
	s.closes.running[seg] = done
	s.closes.Unlock()
	hook := s.closeHook
	go func() {
		if hook != nil {
			hook()
		}
		seg.close()
		s.closes.Lock()
		delete(s.closes.running, seg)
		s.closes.ended++
		s.closes.Unlock()
		close(done)
	}()
}

// closesEnded is how many closes of closeLater have ended.
func (s *Store) closesEnded() uint64 {
	s.closes.Lock()
	defer s.closes.Unlock()
	return s.closes.ended
}

// waitCloses waits for the closes of evicted segments running now.
func (s *Store) waitCloses() {
	s.closes.Lock()
	var chans []chan struct{}
	for _, c := range s.closes.running {
		chans = append(chans, c)
	}
	s.closes.Unlock()
	for _, c := range chans {
		<-c
	}
}

// write is the vectored write of bufs into f at off. A write that finds
// the disk full while files of evicted segments are being closed, or
// were since it began, waits for those closes and writes again, once,
// over whatever part of it was written: a deleted file's blocks are
// freed at its last close at the earliest (a file system may free them
// later still), and that close no longer runs ahead of the write.
func (s *Store) write(f *os.File, bufs [][]byte, off int64) error {
	ended := s.closesEnded()
	_, err := s.writev(f, bufs, off)
	if err == nil || !isNoSpace(err) {
		return err
	}
	s.closes.Lock()
	more := len(s.closes.running) > 0 || s.closes.ended != ended
	s.closes.Unlock()
	if !more {
		return err
	}
	s.waitCloses()
	_, err = s.writev(f, bufs, off)
	return err
}

func (seg *segment) close() {
	seg.f.Close()
	if seg.df != nil {
		seg.df.Close()
	}
}

// Exists reports for each key whether it is present, and its value's size
// in res[i].N. It reads the index only, not the disk. Per-key errors:
// store.ErrNotFound, store.ErrInvalidKey.
func (s *Store) Exists(ctx context.Context, keys []string, res []store.Result) error {
	if err := s.start(ctx, "exists", len(keys), -1, len(res)); err != nil {
		return err
	}
	defer s.exit()
	done := ctx.Done()
	n := 0
	s.mu.Lock()
	for i, key := range keys {
		if canceled(done) {
			failRest(res[i:], ctx.Err())
			break
		}
		if err := store.ValidateKey(key); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		n++
		h1, h2 := s.hash(key)
		if l, ok := s.mu.index[h1]; ok && l.h2 == h2 {
			res[i] = store.Result{N: int(l.size)}
		} else {
			res[i] = store.Result{Err: store.ErrNotFound}
		}
	}
	s.mu.Unlock()
	s.counters.exists.Add(int64(n))
	return nil
}

// Put appends each src[i] to the active segment under keys[i], a batch in
// one vectored write per segment straight from the caller's memory. A
// present key keeps its first value. A value is visible (to Exists, Get,
// and a process that opens the directory later) only once written whole.
// Per-key errors: store.ErrInvalidKey, store.ErrInvalidRegion, and
// store.ErrNoSpace for a value larger than a segment holds, a key whose
// 64-bit hash another key holds, or a full file system (the error names
// the file and offset); nothing is visible of a value whose write failed.
func (s *Store) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	return s.putBatch(ctx, keys, len(src), func(i int) []rdma.Region { return src[i : i+1] }, res)
}

// PutV stores under keys[i] the concatenation of the regions src[i], as
// [Store.Put] stores one region. It implements [store.Vectored].
func (s *Store) PutV(ctx context.Context, keys []string, src [][]rdma.Region, res []store.Result) error {
	return s.putBatch(ctx, keys, len(src), func(i int) []rdma.Region { return src[i] }, res)
}

// pending is one record of a put batch between its reservation and its
// publication.
type pendingRec struct {
	i    int // index in the batch
	h1   uint64
	seg  *segment
	l    loc
	crc  uint32
	srcs []rdma.Region
}

func (s *Store) putBatch(ctx context.Context, keys []string, nsrc int, src func(i int) []rdma.Region, res []store.Result) error {
	if err := s.start(ctx, "put", len(keys), nsrc, len(res)); err != nil {
		return err
	}
	defer s.exit()
	done := ctx.Done()
	type cand struct {
		i    int
		size int
		h1   uint64
		h2   uint16
	}
	cands := make([]cand, 0, len(keys))
	var rejected int64
	for i, key := range keys {
		if canceled(done) {
			failRest(res[i:], ctx.Err())
			keys = keys[:i]
			break
		}
		if err := store.ValidateKey(key); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		size, err := regionsLen("put", key, "source", src(i))
		if err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if recordEnd(0, len(key), size) > s.cfg.SegmentSize {
			res[i] = store.Result{Err: fmt.Errorf("%w: put %.64q: value of %d bytes does not fit a segment of %d bytes", store.ErrNoSpace, key, size, s.cfg.SegmentSize)}
			rejected++
			continue
		}
		h1, h2 := s.hash(key)
		cands = append(cands, cand{i, size, h1, h2})
	}

	// Reserve: the duplicate check and the space, under one hold of mu.
	var recs []pendingRec
	var dups int64
	s.mu.Lock()
	var gone []goneSeg
	var rollErr error
	for _, c := range cands {
		if l, ok := s.mu.index[c.h1]; ok {
			if l.h2 == c.h2 {
				res[c.i] = store.Result{N: c.size}
				dups++
			} else {
				res[c.i] = store.Result{Err: fmt.Errorf("%w: put %.64q: another key has its 64-bit hash", store.ErrNoSpace, keys[c.i])}
				rejected++
			}
			continue
		}
		if _, ok := s.mu.pending[c.h1]; ok {
			res[c.i] = store.Result{N: c.size}
			dups++
			continue
		}
		if rollErr != nil {
			res[c.i] = store.Result{Err: fmt.Errorf("%w: put %.64q: %v", store.ErrNoSpace, keys[c.i], rollErr)}
			rejected++
			continue
		}
		key := keys[c.i]
		seg := s.mu.order[len(s.mu.order)-1]
		off := seg.end
		if recordEnd(off, len(key), c.size) > s.cfg.SegmentSize {
			g, err := s.roll()
			gone = append(gone, g...)
			if err != nil {
				rollErr = err
				res[c.i] = store.Result{Err: fmt.Errorf("%w: put %.64q: %v", store.ErrNoSpace, key, err)}
				rejected++
				continue
			}
			seg = s.mu.order[len(s.mu.order)-1]
			off = 0
		}
		seg.end = recordEnd(off, len(key), c.size)
		seg.pins++
		s.mu.pending[c.h1] = struct{}{}
		recs = append(recs, pendingRec{
			i: c.i, h1: c.h1, seg: seg,
			l:    loc{seg: seg.id, off: uint32(off), size: uint32(c.size), h2: c.h2, klen: uint16(len(key))},
			srcs: src(c.i),
		})
	}
	s.mu.Unlock()
	s.announceGone(gone)

	// Write: one vectored write per run of records in one segment.
	errs := make([]error, len(recs))
	hbuf := make([]byte, 0, len(recs)*(headerSize+64))
	for j := 0; j < len(recs); {
		k := j + 1
		for k < len(recs) && recs[k].seg == recs[j].seg {
			k++
		}
		s.writeRun(keys, recs[j:k], errs[j:k], hbuf)
		j = k
	}

	// Publish.
	var puts, bytesIn int64
	var stored []string
	var unused []*segment // evicted, and this put was the last to use them
	s.mu.Lock()
	for j, r := range recs {
		delete(s.mu.pending, r.h1)
		r.seg.pins--
		if r.seg.dead && r.seg.pins == 0 {
			unused = append(unused, r.seg)
		}
		if errs[j] != nil {
			res[r.i] = store.Result{Err: errs[j]}
			rejected++
			continue
		}
		res[r.i] = store.Result{N: int(r.l.size)}
		puts++
		bytesIn += int64(r.l.size)
		if r.seg.dead || r.l.pos().less(s.mu.clearAt) {
			// Evicted, or removed by a RemoveAll, before it was
			// published: stored, and gone at once.
			continue
		}
		s.mu.index[r.h1] = r.l
		r.seg.keys = append(r.seg.keys, r.h1)
		s.mu.keys++
		s.mu.bytes += int64(r.l.size)
		if s.feeds.Watching() {
			stored = append(stored, keys[r.i])
		}
	}
	s.mu.Unlock()
	for _, seg := range unused {
		s.closeLater(seg)
	}
	for _, k := range stored {
		s.feeds.Announce(store.KeyEvent{Key: k, Op: store.KeyStored})
	}
	s.counters.puts.Add(puts)
	s.counters.dups.Add(dups)
	s.counters.rejected.Add(rejected)
	s.counters.bytesIn.Add(bytesIn)
	return nil
}

var zeros [pageSize]byte

// writeRun writes the records recs, which lie one after the other in one
// segment, in one vectored write: headers from hbuf's memory, values
// straight from the caller's regions. A failed write fails every record of
// the run, with the file, offset and cause.
func (s *Store) writeRun(keys []string, recs []pendingRec, errs []error, hbuf []byte) {
	bufs := make([][]byte, 0, len(recs)*3)
	seg := recs[0].seg
	start := int64(recs[0].l.off)
	for j := range recs {
		r := &recs[j]
		key := keys[r.i]
		off := int64(r.l.off)
		crc := uint32(0)
		for _, x := range r.srcs {
			crc = crc32.Update(crc, castagnoli, x.Bytes())
		}
		vo := valueOffset(off, len(key), int(r.l.size))
		h := make([]byte, vo)
		putHeader(h, kindValue, key, int(r.l.size), off, crc)
		bufs = append(bufs, h)
		for _, x := range r.srcs {
			bufs = append(bufs, x.Bytes())
		}
		end := off + vo + int64(r.l.size)
		if pad := recordEnd(off, len(key), int(r.l.size)) - end; pad > 0 && j+1 < len(recs) {
			bufs = append(bufs, zeros[:pad])
		}
	}
	_ = hbuf
	if err := s.write(seg.f, bufs, start); err != nil {
		base := store.ErrTransfer
		if isNoSpace(err) {
			base = store.ErrNoSpace
		}
		for j := range errs {
			errs[j] = fmt.Errorf("%w: put %.64q: write %s at offset %d: %v", base, keys[recs[j].i], seg.path, start, err)
		}
	}
}

// Get reads the value of each keys[i] from its segment file straight into
// dst[i] (direct I/O when the file system supports it, the destination
// and value are whole pages and the page cache does not hold the value
// whole; the page cache otherwise) and sets res[i].N
// to its size. The record's header and the value's checksum are checked
// before the value is reported: a damaged or torn record is counted in
// [Store.IO], dropped, and reported as store.ErrNotFound (with its file
// and offset), its bytes never reported as a value. Per-key errors:
// store.ErrNotFound, store.ErrBufferTooSmall (dst[i] is not written),
// store.ErrInvalidKey, store.ErrInvalidRegion, store.ErrTransfer (a read
// that failed).
func (s *Store) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	return s.getBatch(ctx, keys, len(dst), func(i int) []rdma.Region { return dst[i : i+1] }, res)
}

// GetV reads the value of each keys[i] across the regions dst[i], as
// [Store.Get] reads it into one. It implements [store.Vectored].
func (s *Store) GetV(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result) error {
	return s.getBatch(ctx, keys, len(dst), func(i int) []rdma.Region { return dst[i] }, res)
}

func (s *Store) getBatch(ctx context.Context, keys []string, ndst int, dst func(i int) []rdma.Region, res []store.Result) error {
	if err := s.start(ctx, "get", len(keys), ndst, len(res)); err != nil {
		return err
	}
	defer s.exit()
	done := ctx.Done()
	var hits, misses, bytesOut int64
	for i, key := range keys {
		if canceled(done) {
			failRest(res[i:], ctx.Err())
			break
		}
		n, err := s.get(key, dst(i))
		res[i] = store.Result{N: n, Err: err}
		switch {
		case err == nil:
			hits++
			bytesOut += int64(n)
		case errors.Is(err, store.ErrNotFound):
			misses++
		}
	}
	s.counters.hits.Add(hits)
	s.counters.misses.Add(misses)
	s.counters.bytesOut.Add(bytesOut)
	return nil
}

func (s *Store) get(key string, dst []rdma.Region) (int, error) {
	if err := store.ValidateKey(key); err != nil {
		return 0, err
	}
	room, err := regionsLen("get", key, "destination", dst)
	if err != nil {
		return 0, err
	}
	h1, h2 := s.hash(key)
	s.mu.Lock()
	l, ok := s.mu.index[h1]
	if !ok || l.h2 != h2 {
		s.mu.Unlock()
		return 0, store.ErrNotFound
	}
	size := int(l.size)
	if size > room {
		s.mu.Unlock()
		return 0, fmt.Errorf("%w: get %.64q: value of %d bytes, destination of %d", store.ErrBufferTooSmall, key, size, room)
	}
	seg := s.mu.segs[l.seg]
	seg.pins++
	fileEnd := seg.end
	s.mu.Unlock()
	defer s.unpin(seg)

	bufs := make([][]byte, 0, len(dst)+1)
	hp := s.hdrs.Get().(*[]byte)
	defer s.hdrs.Put(hp)
	off := int64(l.off)
	vo := valueOffset(off, len(key), size)
	hdr := (*hp)[:vo]
	left := size
	for _, r := range dst {
		if left == 0 {
			break
		}
		n := min(r.Len, left)
		bufs = append(bufs, r.Bytes()[:n])
		left -= n
	}
	// A value the page cache holds whole (written or read lately) is read
	// from it: a direct read would make the kernel write dirty pages back
	// first, then read them again from the device.
	direct := seg.df != nil && alignedValue(size) && len(bufs) == 1 && uintptr(sliceAddr(bufs[0]))%pageSize == 0 &&
		!inPageCache(seg.f, off+vo, int64(size))
	if direct {
		// One direct read from the page the record starts in: the header
		// comes with the value, in one request to the device (a buffered
		// read of it would be one more, and read ahead into the value).
		// The header's pages are the Go heap's (hp, page aligned): the
		// kernel writes them within this system call, which the buffer
		// outlives; Go's collector does not move heap memory.
		start := off &^ (pageSize - 1)
		span := (*hp)[:off+vo-start]
		_, err = vecIO(false, seg.df, [][]byte{span, bufs[0]}, start)
		hdr = span[off-start:]
		s.counters.direct.Add(1)
	} else {
		_, err = vecIO(false, seg.f, append([][]byte{hdr}, bufs...), off)
		s.counters.buffered.Add(1)
	}
	if err != nil {
		if errors.Is(err, errShort) {
			return 0, s.corrupt(seg, h1, l, fmt.Errorf("get %.64q: %s at offset %d: the record is cut short", key, seg.path, off))
		}
		return 0, fmt.Errorf("%w: get %.64q: read %s at offset %d: %v", store.ErrTransfer, key, seg.path, off, err)
	}
	h, k, err := parseHeader(hdr, off, fileEnd)
	switch {
	case err != nil:
		return 0, s.corrupt(seg, h1, l, fmt.Errorf("get %.64q: %s at offset %d: %v", key, seg.path, off, err))
	case h.kind != kindValue || string(k) != key || h.size != int64(size):
		return 0, s.corrupt(seg, h1, l, fmt.Errorf("get %.64q: %s at offset %d: the record holds %q, %d bytes", key, seg.path, off, k, h.size))
	}
	if s.cfg.TrustValues {
		return size, nil
	}
	crc := uint32(0)
	for _, b := range bufs {
		crc = crc32.Update(crc, castagnoli, b)
	}
	if crc != h.crc {
		return 0, s.corrupt(seg, h1, l, fmt.Errorf("get %.64q: %s at offset %d: value checksum %#08x, want %#08x", key, seg.path, off, crc, h.crc))
	}
	return size, nil
}

// corrupt drops the record at l, which a Get found damaged, from the
// index, counts it, and returns err as a store.ErrNotFound.
func (s *Store) corrupt(seg *segment, h1 uint64, l loc, err error) error {
	s.counters.corrupt.Add(1)
	s.mu.Lock()
	if cur, ok := s.mu.index[h1]; ok && cur == l {
		delete(s.mu.index, h1)
		s.mu.keys--
		s.mu.bytes -= int64(l.size)
	}
	s.mu.Unlock()
	s.log.Warn("diskstore: damaged record dropped", "err", err)
	return fmt.Errorf("%w: diskstore: damaged record: %v", store.ErrNotFound, err)
}

// Remove deletes key, or returns store.ErrNotFound. It appends a
// tombstone record, so that the key stays deleted after a restart; a Get
// reading the value meanwhile reads it whole.
func (s *Store) Remove(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	h1, h2 := s.hash(key)
	s.mu.Lock()
	l, ok := s.mu.index[h1]
	s.mu.Unlock()
	if !ok || l.h2 != h2 {
		return store.ErrNotFound
	}
	n, err := s.removeKeys([]string{key}, []loc{l})
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// removeKeys appends tombstones for keys, whose index entries were locs
// when looked up, and drops those entries that have not changed since.
// It returns how many it dropped.
func (s *Store) removeKeys(keys []string, locs []loc) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	seg, start, gone, err := s.reserve(func(off int64) int64 {
		for _, k := range keys {
			off = recordEnd(off, len(k), 0)
		}
		return off
	})
	s.announceGone(gone)
	if err != nil {
		return 0, err
	}
	var buf []byte
	off := start
	for _, k := range keys {
		end := recordEnd(off, len(k), 0)
		b := make([]byte, end-off)
		putHeader(b, kindTombstone, k, 0, off, 0)
		buf = append(buf, b...)
		off = end
	}
	err = s.write(seg.f, [][]byte{buf}, start)
	s.unpin(seg)
	if err != nil {
		return 0, fmt.Errorf("diskstore: remove: write %s at offset %d: %w", seg.path, start, err)
	}
	n := 0
	s.mu.Lock()
	for i, k := range keys {
		h1, _ := s.hash(k)
		if cur, ok := s.mu.index[h1]; ok && cur == locs[i] {
			delete(s.mu.index, h1)
			s.mu.keys--
			s.mu.bytes -= int64(cur.size)
			n++
			if s.feeds.Watching() {
				s.feeds.Announce(store.KeyEvent{Key: k, Op: store.KeyRemoved})
			}
		}
	}
	s.mu.Unlock()
	return n, nil
}

// reserve reserves room in the active segment for records that, starting
// at an offset, end where end says, rolling to a new segment if needed.
// The segment comes back pinned.
func (s *Store) reserve(end func(off int64) int64) (*segment, int64, []goneSeg, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var gone []goneSeg
	seg := s.mu.order[len(s.mu.order)-1]
	if end(seg.end) > s.cfg.SegmentSize {
		if end(0) > s.cfg.SegmentSize {
			return nil, 0, nil, fmt.Errorf("diskstore: %d bytes of records do not fit a segment of %d", end(0), s.cfg.SegmentSize)
		}
		g, err := s.roll()
		gone = g
		if err != nil {
			return nil, 0, gone, err
		}
		seg = s.mu.order[len(s.mu.order)-1]
	}
	start := seg.end
	seg.end = end(start)
	seg.pins++
	return seg, start, gone, nil
}

// RemovePrefix deletes every key that starts with prefix and returns how
// many it deleted. The index holds no keys, so it reads the key of every
// record from disk: it is slow, made for rare cleanups. The prefix must
// be a valid key: an empty one is an error wrapping store.ErrInvalidKey.
func (s *Store) RemovePrefix(ctx context.Context, prefix string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := store.ValidateKey(prefix); err != nil {
		return 0, fmt.Errorf("diskstore: remove prefix: %w", err)
	}
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	type live struct {
		seg *segment
		l   loc
	}
	var all []live
	s.mu.Lock()
	for _, l := range s.mu.index {
		seg := s.mu.segs[l.seg]
		seg.pins++
		all = append(all, live{seg, l})
	}
	s.mu.Unlock()
	var keys []string
	var locs []loc
	var readErr error
	for j, x := range all {
		if readErr == nil && j%256 == 0 {
			readErr = ctx.Err()
		}
		if readErr == nil && int(x.l.klen) >= len(prefix) {
			k, err := s.readKey(x.seg, x.l)
			if err != nil {
				readErr = fmt.Errorf("diskstore: remove prefix: read %s at offset %d: %w", x.seg.path, x.l.off, err)
			} else if strings.HasPrefix(k, prefix) {
				keys = append(keys, k)
				locs = append(locs, x.l)
			}
		}
		s.unpin(x.seg)
	}
	if readErr != nil {
		return 0, readErr
	}
	n := 0
	for len(keys) > 0 {
		// Tombstones of one call must fit one segment.
		m := min(len(keys), int(s.cfg.SegmentSize/(2*(headerSize+store.MaxKeyLen))))
		k, err := s.removeKeys(keys[:m], locs[:m])
		n += k
		if err != nil {
			return n, err
		}
		keys, locs = keys[m:], locs[m:]
	}
	return n, nil
}

// RemoveAll deletes every key and returns how many it deleted: it appends
// one clear record, which Open reads as the end of everything before it.
func (s *Store) RemoveAll(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	seg, start, gone, err := s.reserve(func(off int64) int64 { return recordEnd(off, 0, 0) })
	s.announceGone(gone)
	if err != nil {
		return 0, err
	}
	b := make([]byte, recordEnd(start, 0, 0)-start)
	putHeader(b, kindClear, "", 0, start, 0)
	err = s.write(seg.f, [][]byte{b}, start)
	if err != nil {
		s.unpin(seg)
		return 0, fmt.Errorf("diskstore: remove all: write %s at offset %d: %w", seg.path, start, err)
	}
	at := pos{seg.id, uint32(start)}
	type removed struct {
		seg *segment
		l   loc
	}
	var ann []removed
	n := 0
	s.mu.Lock()
	if s.mu.clearAt.less(at) {
		s.mu.clearAt = at
	}
	for h, l := range s.mu.index {
		if l.pos().less(at) {
			delete(s.mu.index, h)
			s.mu.keys--
			s.mu.bytes -= int64(l.size)
			n++
			if s.feeds.Watching() {
				x := s.mu.segs[l.seg]
				x.pins++
				ann = append(ann, removed{x, l})
			}
		}
	}
	s.mu.Unlock()
	s.unpin(seg)
	for _, a := range ann {
		if k, err := s.readKey(a.seg, a.l); err == nil {
			s.feeds.Announce(store.KeyEvent{Key: k, Op: store.KeyRemoved})
		}
		s.unpin(a.seg)
	}
	return n, nil
}

// Register checks r, a host region, and records it; diskstore takes any
// host region in Put and Get, registered or not. A region that overlaps a
// registered one is refused with store.ErrInvalidRegion.
func (s *Store) Register(r rdma.Region) error {
	if err := checkShape(r); err != nil {
		return fmt.Errorf("%w: register %s", store.ErrInvalidRegion, err)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	return s.regs.Add(r)
}

// Unregister forgets a region recorded by Register.
func (s *Store) Unregister(r rdma.Region) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	return s.regs.Remove(r)
}

// Stats returns the store's counters. Keys and Bytes count the values the
// index holds; Capacity is Config.Capacity, in bytes of segment files.
func (s *Store) Stats() store.Stats {
	st := store.Stats{
		Capacity:     s.cfg.Capacity,
		Hits:         s.counters.hits.Load(),
		Misses:       s.counters.misses.Load(),
		Exists:       s.counters.exists.Load(),
		Puts:         s.counters.puts.Load(),
		Duplicates:   s.counters.dups.Load(),
		RejectedPuts: s.counters.rejected.Load(),
		Evictions:    s.counters.evictions.Load(),
		BytesIn:      s.counters.bytesIn.Load(),
		BytesOut:     s.counters.bytesOut.Load(),
	}
	s.mu.Lock()
	st.Keys, st.Bytes = s.mu.keys, s.mu.bytes
	s.mu.Unlock()
	return st
}

// IOStats are what [Store.IO] reports: how the store reads, and what it
// found damaged.
type IOStats struct {
	Direct        bool  // the file system takes direct I/O and Config.Buffered is off
	DirectReads   int64 // values read with O_DIRECT
	BufferedReads int64 // values read through the page cache: not whole pages, not into one aligned region, or held whole by it
	Corrupt       int64 // records a Get found damaged or torn, dropped and never served
	Skipped       int64 // damaged stretches of segment files that Open skipped
	SkippedBytes  int64 // the bytes of those stretches
	Segments      int   // segment files
	FileBytes     int64 // bytes of segment files, the active one's reservation included
}

// IO reports how the store reads and what it found damaged.
func (s *Store) IO() IOStats {
	st := IOStats{
		Direct:        s.direct,
		DirectReads:   s.counters.direct.Load(),
		BufferedReads: s.counters.buffered.Load(),
		Corrupt:       s.counters.corrupt.Load(),
		Skipped:       s.counters.skipped.Load(),
		SkippedBytes:  s.counters.skippedBytes.Load(),
	}
	s.mu.Lock()
	st.Segments, st.FileBytes = len(s.mu.order), s.mu.used
	s.mu.Unlock()
	return st
}

// Leases reports that diskstore grants no read leases: removals take
// every key they name at once, and a Get reading a value whose segment is
// deleted under it reads from the still open file. It implements
// [store.Leaser].
func (s *Store) Leases() store.Leases { return store.Leases{} }

// Watch starts a feed of the keys that are stored, evicted (with their
// segment) and removed. It implements [store.Watcher].
func (s *Store) Watch(n int) (*store.Feed, error) {
	if err := s.enter(); err != nil {
		return nil, fmt.Errorf("diskstore: watch: %w", err)
	}
	defer s.exit()
	return s.feeds.Watch(n)
}

// Close waits for the calls in flight, closes the segment files and
// releases the directory's lock. The values stay on disk for the next
// Open. Later calls return store.ErrClosed; Close is idempotent.
func (s *Store) Close() error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.life.closed {
		return nil
	}
	s.life.closed = true
	s.feeds.Close()
	return s.closeFiles()
}

func (s *Store) closeFiles() error {
	s.mu.Lock()
	for _, seg := range s.mu.order {
		seg.close()
	}
	s.mu.order, s.mu.segs, s.mu.index = nil, map[uint32]*segment{}, map[uint64]loc{}
	s.mu.keys, s.mu.bytes = 0, 0
	s.mu.Unlock()
	s.waitCloses() // every file closed before the directory is free
	if err := s.lock.Close(); err != nil {
		return fmt.Errorf("diskstore: close: %w", err)
	}
	return nil
}

func canceled(done <-chan struct{}) bool {
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

func failRest(res []store.Result, err error) {
	for i := range res {
		res[i] = store.Result{Err: err}
	}
}

// sortedSegments lists the segment files of dir in id order.
func sortedSegments(dir string) ([]uint32, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []uint32
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".seg")
		if !ok || e.IsDir() {
			continue
		}
		id, err := strconv.ParseUint(name, 10, 32)
		if err != nil {
			continue
		}
		ids = append(ids, uint32(id))
	}
	slices.Sort(ids)
	return ids, nil
}
