package tiered

import (
	"hash/maphash"
	"sync"
)

// sketch is a count-min sketch of 4-bit counters in 4 rows: how often a
// key was used lately. Every 10 × width increments all counters halve.
type sketch struct {
	seed  maphash.Seed
	mu    sync.Mutex
	rows  [4][]uint8
	mask  uint64
	adds  int
	reset int
}

func newSketch(width int) *sketch {
	w := 1
	for w < width {
		w <<= 1
	}
	s := &sketch{seed: maphash.MakeSeed(), mask: uint64(w - 1), reset: 10 * w}
	for i := range s.rows {
		s.rows[i] = make([]uint8, w)
	}
	return s
}

// add counts one use of key and returns the key's estimate after it.
func (s *sketch) add(key string) int {
	h := maphash.String(s.seed, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	est := 15
	for i := range s.rows {
		j := s.index(h, i)
		c := s.rows[i][j]
		if c < 15 {
			c++
			s.rows[i][j] = c
		}
		est = min(est, int(c))
	}
	s.adds++
	if s.adds >= s.reset {
		s.adds = 0
		for i := range s.rows {
			for j := range s.rows[i] {
				s.rows[i][j] >>= 1
			}
		}
	}
	return est
}

// estimate returns key's estimate without counting a use.
func (s *sketch) estimate(key string) int {
	h := maphash.String(s.seed, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	est := 15
	for i := range s.rows {
		est = min(est, int(s.rows[i][s.index(h, i)]))
	}
	return est
}

func (s *sketch) index(h uint64, i int) uint64 {
	if i == 0 {
		return h & s.mask
	}
	return (h*uint64(2*i+1) + h>>(7*i)) & s.mask
}
