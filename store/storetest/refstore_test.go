package storetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// bug is a deliberate defect of refStore, to prove that Run catches it.
type bug int

const (
	noBug                bug = iota
	bugServesAfterRemove     // Remove reports success and keeps the key
	bugLastWriterWins        // a second put replaces the value
	bugEvictsDuringRead      // Get evicts and poisons the value half way through its copy
	bugAcceptsSpaces         // keys with spaces are accepted
	bugIgnoresMismatch       // batch slices of different lengths are served up to the shortest
	bugWritesShortBuffer     // a too-short destination is written before ErrBufferTooSmall
	bugVanishes              // every fifth put silently drops the oldest key
	bugOpenAfterClose        // Close does not close
	bugPrefixMiscount        // RemovePrefix reports one key more than it removed
	bugIgnoresContext        // canceled contexts are ignored
	bugRetainsSource         // Put keeps the source region and Get reads it then
	bugWritesPastValue       // Get zeroes the destination past the value
	bugStatsOffByOne         // Stats counts one key too many
)

// refStore is a simple, correct store on the Go heap, one mutex around
// everything, with an optional FIFO eviction and an optional bug.
type refStore struct {
	bug      bug
	capacity int // bytes; 0: no eviction

	mu     sync.Mutex
	m      map[string][]byte
	src    map[string]rdma.Region // bugRetainsSource
	order  []string               // insertion order, for eviction
	used   int
	puts   int
	regs   []rdma.Region
	closed bool
}

var _ store.Store = (*refStore)(nil)

func newRefStore(b bug, capacity int) *refStore {
	return &refStore{bug: b, capacity: capacity, m: map[string][]byte{}, src: map[string]rdma.Region{}}
}

func (s *refStore) validKey(k string) error {
	if s.bug == bugAcceptsSpaces {
		k = strings.ReplaceAll(k, " ", "_")
	}
	return store.ValidateKey(k)
}

func validRegion(r rdma.Region) error {
	if r.Len <= 0 || r.Addr == 0 || r.Loc != rdma.Host {
		return fmt.Errorf("%w: %+v", store.ErrInvalidRegion, r)
	}
	return nil
}

func (s *refStore) begin(ctx context.Context, op string, keys, regions, res int) error {
	if s.bug != bugIgnoresMismatch {
		if err := store.CheckBatch(op, keys, regions, res); err != nil {
			return err
		}
	}
	if s.bug != bugIgnoresContext {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if s.closed {
		return store.ErrClosed
	}
	return nil
}

func batchLen(keys int, others ...int) int {
	for _, o := range others {
		keys = min(keys, o)
	}
	return keys
}

func (s *refStore) Exists(ctx context.Context, keys []string, res []store.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "exists", len(keys), -1, len(res)); err != nil {
		return err
	}
	for i := range batchLen(len(keys), len(res)) {
		if err := s.validKey(keys[i]); err != nil {
			res[i] = store.Result{Err: err}
		} else if v, ok := s.m[keys[i]]; ok {
			res[i] = store.Result{N: len(v)}
		} else {
			res[i] = store.Result{Err: store.ErrNotFound}
		}
	}
	return nil
}

func (s *refStore) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "put", len(keys), len(src), len(res)); err != nil {
		return err
	}
	for i := range batchLen(len(keys), len(src), len(res)) {
		k := keys[i]
		if err := s.validKey(k); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if err := validRegion(src[i]); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if _, ok := s.m[k]; ok && s.bug != bugLastWriterWins {
			res[i] = store.Result{N: src[i].Len}
			continue
		}
		if s.capacity > 0 {
			if src[i].Len > s.capacity {
				res[i] = store.Result{Err: store.ErrNoSpace}
				continue
			}
			for s.used+src[i].Len > s.capacity {
				s.drop(s.order[0])
			}
		}
		s.puts++
		if s.bug == bugVanishes && s.puts%5 == 0 && len(s.order) > 0 {
			s.drop(s.order[0])
		}
		if old, ok := s.m[k]; ok {
			s.used -= len(old)
			s.order = slices.DeleteFunc(s.order, func(x string) bool { return x == k })
		}
		s.m[k] = slices.Clone(src[i].Bytes())
		s.src[k] = src[i]
		s.order = append(s.order, k)
		s.used += src[i].Len
		res[i] = store.Result{N: src[i].Len}
	}
	return nil
}

func (s *refStore) drop(k string) {
	s.used -= len(s.m[k])
	delete(s.m, k)
	delete(s.src, k)
	s.order = slices.DeleteFunc(s.order, func(x string) bool { return x == k })
}

func (s *refStore) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "get", len(keys), len(dst), len(res)); err != nil {
		return err
	}
	for i := range batchLen(len(keys), len(dst), len(res)) {
		k := keys[i]
		if err := s.validKey(k); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		if err := validRegion(dst[i]); err != nil {
			res[i] = store.Result{Err: err}
			continue
		}
		v, ok := s.m[k]
		if !ok {
			res[i] = store.Result{Err: store.ErrNotFound}
			continue
		}
		if s.bug == bugRetainsSource {
			v = s.src[k].Bytes()
		}
		b := dst[i].Bytes()
		if len(v) > len(b) {
			if s.bug == bugWritesShortBuffer {
				copy(b, v)
			}
			res[i] = store.Result{Err: fmt.Errorf("%w: %d > %d", store.ErrBufferTooSmall, len(v), len(b))}
			continue
		}
		half := len(v) / 2
		copy(b, v[:half])
		if s.bug == bugEvictsDuringRead {
			s.drop(k)
			clear(v)
		}
		copy(b[half:], v[half:])
		if s.bug == bugWritesPastValue {
			clear(b[len(v):])
		}
		res[i] = store.Result{N: len(v)}
	}
	return nil
}

func (s *refStore) Remove(ctx context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "remove", 0, -1, 0); err != nil {
		return err
	}
	if err := s.validKey(key); err != nil {
		return err
	}
	if _, ok := s.m[key]; !ok {
		return store.ErrNotFound
	}
	if s.bug != bugServesAfterRemove {
		s.drop(key)
	}
	return nil
}

func (s *refStore) RemovePrefix(ctx context.Context, prefix string) (int, error) {
	if prefix == "" {
		return 0, fmt.Errorf("%w: empty prefix", store.ErrInvalidKey)
	}
	return s.removeIf(ctx, func(k string) bool { return strings.HasPrefix(k, prefix) })
}

func (s *refStore) RemoveAll(ctx context.Context) (int, error) {
	return s.removeIf(ctx, func(string) bool { return true })
}

func (s *refStore) removeIf(ctx context.Context, match func(string) bool) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.begin(ctx, "remove", 0, -1, 0); err != nil {
		return 0, err
	}
	n := 0
	for k := range s.m {
		if match(k) {
			s.drop(k)
			n++
		}
	}
	if s.bug == bugPrefixMiscount && n > 0 {
		n++
	}
	return n, nil
}

func (s *refStore) Register(r rdma.Region) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	if err := validRegion(r); err != nil {
		return err
	}
	for _, x := range s.regs {
		if r.Addr < x.End() && x.Addr < r.End() {
			return fmt.Errorf("%w: %+v overlaps %+v", store.ErrInvalidRegion, r, x)
		}
	}
	s.regs = append(s.regs, r)
	return nil
}

func (s *refStore) Unregister(r rdma.Region) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	i := slices.Index(s.regs, r)
	if i < 0 {
		return fmt.Errorf("%w: %+v not registered", store.ErrInvalidRegion, r)
	}
	s.regs = slices.Delete(s.regs, i, i+1)
	return nil
}

func (s *refStore) Stats() store.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := store.Stats{Keys: int64(len(s.m)), Bytes: int64(s.used), Capacity: int64(s.capacity)}
	if s.bug == bugStatsOffByOne {
		st.Keys++
	}
	return st
}

func (s *refStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bug != bugOpenAfterClose {
		s.closed = true
	}
	return nil
}
