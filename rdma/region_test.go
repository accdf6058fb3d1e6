package rdma_test

import (
	"errors"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
)

func TestLocation(t *testing.T) {
	for _, tc := range []struct {
		l       rdma.Location
		host    bool
		ordinal int
		str     string
	}{
		{rdma.Host, true, -1, "cpu"},
		{rdma.Device(0), false, 0, "cuda:0"},
		{rdma.Device(3), false, 3, "cuda:3"},
	} {
		if got := tc.l.IsHost(); got != tc.host {
			t.Errorf("%v.IsHost() = %v, want %v", tc.l, got, tc.host)
		}
		if got := tc.l.Ordinal(); got != tc.ordinal {
			t.Errorf("%v.Ordinal() = %d, want %d", tc.l, got, tc.ordinal)
		}
		if got := tc.l.String(); got != tc.str {
			t.Errorf("Location(%d).String() = %q, want %q", int32(tc.l), got, tc.str)
		}
	}
}

func TestRegionSub(t *testing.T) {
	r := rdma.Region{Addr: 0x1000, Len: 100, Loc: rdma.Device(1)}
	for _, tc := range []struct {
		off, n int
		want   rdma.Region
		ok     bool
	}{
		{0, 100, r, true},
		{10, 20, rdma.Region{Addr: 0x100a, Len: 20, Loc: rdma.Device(1)}, true},
		{100, 0, rdma.Region{Addr: 0x1064, Len: 0, Loc: rdma.Device(1)}, true},
		{0, 101, rdma.Region{}, false},
		{101, 0, rdma.Region{}, false},
		{-1, 1, rdma.Region{}, false},
		{1, -1, rdma.Region{}, false},
		{50, 51, rdma.Region{}, false},
		{1, int(^uint(0) >> 1), rdma.Region{}, false},
	} {
		got, err := r.Sub(tc.off, tc.n)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("Sub(%d, %d) = %+v, %v; want %+v, ok %v", tc.off, tc.n, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, rdma.ErrOutOfRange) {
			t.Errorf("Sub(%d, %d) error %v does not wrap ErrOutOfRange", tc.off, tc.n, err)
		}
		if err == nil && !r.Contains(got) {
			t.Errorf("%+v.Contains(Sub(%d, %d)) = false", r, tc.off, tc.n)
		}
	}
}

func TestRegionContains(t *testing.T) {
	r := rdma.Region{Addr: 0x1000, Len: 0x100, Loc: rdma.Host}
	for _, tc := range []struct {
		s    rdma.Region
		want bool
	}{
		{r, true},
		{rdma.Region{Addr: 0x1080, Len: 0x80, Loc: rdma.Host}, true},
		{rdma.Region{Addr: 0x1080, Len: 0x81, Loc: rdma.Host}, false},
		{rdma.Region{Addr: 0xfff, Len: 1, Loc: rdma.Host}, false},
		{rdma.Region{Addr: 0x1000, Len: 1, Loc: rdma.Device(0)}, false},
		{rdma.Region{Addr: 0x1000, Len: -1, Loc: rdma.Host}, false},
		{rdma.Region{Addr: ^uintptr(0), Len: 2, Loc: rdma.Host}, false},
	} {
		if got := r.Contains(tc.s); got != tc.want {
			t.Errorf("%+v.Contains(%+v) = %v, want %v", r, tc.s, got, tc.want)
		}
	}
	if got, want := r.End(), uintptr(0x1100); got != want {
		t.Errorf("End() = %#x, want %#x", got, want)
	}
}

func TestRegionBytesNotHost(t *testing.T) {
	for _, r := range []rdma.Region{
		{},
		{Addr: 0x1000, Len: 10, Loc: rdma.Device(0)},
		{Addr: 0x1000, Len: 0, Loc: rdma.Host},
		{Addr: 0, Len: 10, Loc: rdma.Host},
	} {
		if got := r.Bytes(); got != nil {
			t.Errorf("%+v.Bytes() has len %d, want nil", r, len(got))
		}
	}
}

func TestCopyBadRegions(t *testing.T) {
	// Only addresses: every case fails before anything is copied.
	good := rdma.Region{Addr: 0x1000, Len: 8, Loc: rdma.Host}
	for _, tc := range []struct {
		name     string
		dst, src rdma.Region
		want     error
	}{
		{"device dst", rdma.Region{Addr: 0x1000, Len: 8, Loc: rdma.Device(0)}, good, rdma.ErrUnsupported},
		{"device src", good, rdma.Region{Addr: 0x1000, Len: 8, Loc: rdma.Device(2)}, errors.ErrUnsupported},
		{"negative length", rdma.Region{Addr: 0x1000, Len: -1, Loc: rdma.Host}, good, rdma.ErrInvalidRegion},
		{"nil address", good, rdma.Region{Len: 8, Loc: rdma.Host}, rdma.ErrInvalidRegion},
		{"wraps around", good, rdma.Region{Addr: ^uintptr(0) - 2, Len: 8, Loc: rdma.Host}, rdma.ErrInvalidRegion},
	} {
		n, err := rdma.Copy(tc.dst, tc.src)
		if n != 0 || !errors.Is(err, tc.want) {
			t.Errorf("%s: Copy(%+v, %+v) = %d, %v; want 0, an error wrapping %v", tc.name, tc.dst, tc.src, n, err, tc.want)
		}
	}
	empty := rdma.Region{Addr: 0x1000, Len: 0, Loc: rdma.Device(1)}
	for _, r := range []rdma.Region{{}, empty} {
		if n, err := rdma.Copy(r, good); n != 0 || err != nil {
			t.Errorf("Copy(%+v, %+v) = %d, %v; want 0, nil", r, good, n, err)
		}
	}
}
