//go:build linux

package cudart

import (
	"runtime"
	"sync"
	"syscall"
	"testing"
)

// threadCheck wraps a fake table so that it tracks the current device per
// OS thread, as CUDA does, and counts copies issued on a thread whose
// current device is not the stream's.
type threadCheck struct {
	mu         sync.Mutex
	current    map[int]int32     // OS thread id -> device set on it
	streams    map[uintptr]int32 // stream -> device current at its creation
	copies     int
	violations int
}

func (c *threadCheck) wrap(t *table) {
	setDevice, create, memcpy := t.setDevice, t.streamCreateWithFlags, t.memcpyAsync
	t.setDevice = func(d int32) int32 {
		code := setDevice(d)
		c.mu.Lock()
		c.current[syscall.Gettid()] = d
		c.mu.Unlock()
		runtime.Gosched() // invite the scheduler to move an unlocked goroutine
		return code
	}
	t.streamCreateWithFlags = func(s *uintptr, flags uint32) int32 {
		code := create(s, flags)
		c.mu.Lock()
		c.streams[*s] = c.current[syscall.Gettid()]
		c.mu.Unlock()
		return code
	}
	t.memcpyAsync = func(dst, src, n uintptr, kind int32, s uintptr) int32 {
		c.mu.Lock()
		cur, ok := c.current[syscall.Gettid()]
		c.copies++
		if !ok || cur != c.streams[s] {
			c.violations++
		}
		c.mu.Unlock()
		return memcpy(dst, src, n, kind, s)
	}
}

func newThreadCheck() *threadCheck {
	return &threadCheck{current: map[int]int32{}, streams: map[uintptr]int32{}}
}

// TestThreadCheckFails proves the check can fail: a copy issued from an OS
// thread whose current device differs from the stream's is counted.
func TestThreadCheckFails(t *testing.T) {
	f := newFake(11080, false)
	tab := f.table()
	c := newThreadCheck()
	c.wrap(tab)
	var s uintptr
	done := make(chan struct{})
	go func() { // thread A: device 1, creates the stream
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tab.setDevice(1)
		tab.streamCreateWithFlags(&s, 0)
	}()
	<-done
	done = make(chan struct{})
	go func() { // thread B (a locked thread is never shared): device 0
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tab.setDevice(0)
		tab.memcpyAsync(1, 2, 3, 1, s)
	}()
	<-done
	if c.violations != 1 {
		t.Errorf("violations = %d, want 1 for a copy on a thread with the wrong device", c.violations)
	}
}

// TestThreadDevice issues copies from many goroutines on streams of two
// devices: each copy must run on the OS thread where its device was just
// made current.
func TestThreadDevice(t *testing.T) {
	f := newFake(11080, false)
	r := f.runtime()
	c := newThreadCheck()
	c.wrap(r.t)
	var streams []*Stream
	for ord := range 2 {
		d, err := r.Device(ord)
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			s, err := d.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, s)
		}
	}
	const perGoroutine = 200
	var wg sync.WaitGroup
	for g, s := range streams {
		wg.Go(func() {
			for i := range perGoroutine {
				var err error
				if i%2 == 0 {
					err = s.CopyAsync(HostToDevice, 0x100, 0x200, 8+g)
				} else {
					err = s.CopyBatch(DeviceToHost, blocks(3, 16))
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	want := len(streams) * (perGoroutine/2 + perGoroutine/2*3)
	if c.copies != want || c.violations != 0 {
		t.Errorf("%d copies with %d on the wrong device, want %d copies and none", c.copies, c.violations, want)
	}
}
