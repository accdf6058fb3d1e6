package shm

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"unsafe"

	"github.com/kvconnect/kvconnect/rdma"
)

// peer is the client's side of a connection to an owner: the exchanges
// and the owner's memory as mapped here.
type peer struct {
	name string
	c    *net.UnixConn
	refs sync.WaitGroup // tasks queued or running for it

	mu struct {
		sync.Mutex // one exchange at a time
		buf        []byte
		oob        []byte
		err        error // the connection failed: every later request fails
	}

	// mm guards the mappings: copies hold it for reading, unmapping for
	// writing.
	mm struct {
		sync.RWMutex
		maps   map[uint64][]byte // memory id -> mapping of the whole file
		closed bool
	}
}

func newPeer(name string, c *net.UnixConn) *peer {
	p := &peer{name: name, c: c}
	p.mu.buf = make([]byte, bufSize)
	p.mu.oob = make([]byte, syscall.CmsgSpace(4*4))
	p.mm.maps = make(map[uint64][]byte)
	return p
}

// failed returns the connection's failure, or nil.
func (p *peer) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.err
}

// exchange sends msg and, unless the message has no reply, reads the
// reply and returns it (valid until the next exchange) with the file that
// came with it, or -1. p.mu is held.
func (p *peer) exchange(msg []byte, reply bool) ([]byte, int, error) {
	if p.mu.err != nil {
		return nil, -1, p.mu.err
	}
	fail := func(err error) ([]byte, int, error) {
		p.mu.err = fmt.Errorf("shm: segment %q: %w", p.name, err)
		return nil, -1, p.mu.err
	}
	if _, _, err := p.c.WriteMsgUnix(msg, nil, nil); err != nil {
		return fail(err)
	}
	if !reply {
		return nil, -1, nil
	}
	n, oobn, flags, _, err := p.c.ReadMsgUnix(p.mu.buf, p.mu.oob)
	switch {
	case err != nil:
		return fail(err)
	case n == 0:
		return fail(errors.New("the peer hung up"))
	case flags&(syscall.MSG_TRUNC|syscall.MSG_CTRUNC) != 0:
		return fail(fmt.Errorf("%w: a reply too long", errProtocol))
	case p.mu.buf[0] != msg[0]:
		return fail(fmt.Errorf("%w: reply %d to message %d", errProtocol, p.mu.buf[0], msg[0]))
	}
	fd := -1
	if oobn > 0 {
		cms, err := syscall.ParseSocketControlMessage(p.mu.oob[:oobn])
		if err != nil {
			return fail(err)
		}
		for _, cm := range cms {
			fds, err := syscall.ParseUnixRights(&cm)
			if err != nil {
				continue
			}
			for _, f := range fds {
				if fd < 0 {
					fd = f
				} else if err := syscall.Close(f); err != nil {
					return fail(err)
				}
			}
		}
	}
	return p.mu.buf[:n], fd, nil
}

// grant is the owner's answer for one range.
type grant struct {
	ok  bool
	mem uint64
	off uint64
}

// grant asks the owner for the remote ranges of reqs, at most maxGrant.
func (p *peer) grant(reqs []rdma.Request) (uint64, []grant, error) {
	msg := make([]byte, 5+16*len(reqs))
	msg[0] = opGrant
	le.PutUint32(msg[1:], uint32(len(reqs)))
	for i, r := range reqs {
		le.PutUint64(msg[5+16*i:], uint64(r.Remote))
		le.PutUint64(msg[13+16*i:], uint64(r.Local.Len))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	reply, fd, err := p.exchange(msg, true)
	if fd >= 0 {
		err = errors.Join(err, syscall.Close(fd))
	}
	if err != nil {
		return 0, nil, err
	}
	if len(reply) != 9+17*len(reqs) {
		p.mu.err = fmt.Errorf("shm: segment %q: %w: grant reply of %d bytes for %d ranges", p.name, errProtocol, len(reply), len(reqs))
		return 0, nil, p.mu.err
	}
	gs := make([]grant, len(reqs))
	for i := range gs {
		g := reply[9+17*i:]
		gs[i] = grant{ok: g[0] == 1, mem: le.Uint64(g[1:]), off: le.Uint64(g[9:])}
	}
	return le.Uint64(reply[1:]), gs, nil
}

// release ends a grant.
func (p *peer) release(id uint64) error {
	msg := make([]byte, 9)
	msg[0] = opRelease
	le.PutUint64(msg[1:], id)
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _, err := p.exchange(msg, false)
	return err
}

// mapMem maps the owner's memory id here, unless it is mapped already.
func (p *peer) mapMem(id uint64) error {
	p.mm.RLock()
	_, ok := p.mm.maps[id]
	p.mm.RUnlock()
	if ok {
		return nil
	}
	msg := make([]byte, 9)
	msg[0] = opMap
	le.PutUint64(msg[1:], id)
	p.mu.Lock()
	reply, fd, err := p.exchange(msg, true)
	var size uint64
	if err == nil {
		size = le.Uint64(reply[2:])
		switch {
		case len(reply) != 10:
			err = fmt.Errorf("shm: segment %q: %w: map reply of %d bytes", p.name, errProtocol, len(reply))
		case reply[1] != 1:
			err = fmt.Errorf("shm: segment %q: memory %d is gone", p.name, id)
		case fd < 0:
			err = fmt.Errorf("shm: segment %q: %w: memory %d came without its file", p.name, errProtocol, id)
		}
	}
	p.mu.Unlock()
	if err != nil {
		if fd >= 0 {
			err = errors.Join(err, syscall.Close(fd))
		}
		return err
	}
	mem, err := mapPeerFile(fd, int(size))
	if cerr := syscall.Close(fd); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		if mem != nil {
			err = errors.Join(err, syscall.Munmap(mem))
		}
		return fmt.Errorf("shm: segment %q: memory %d: %w", p.name, id, err)
	}
	p.mm.Lock()
	defer p.mm.Unlock()
	if _, dup := p.mm.maps[id]; dup || p.mm.closed {
		return syscall.Munmap(mem)
	}
	p.mm.maps[id] = mem
	return nil
}

// unmap unmaps the owner's memory; later copies fail.
func (p *peer) unmap() error {
	p.mm.Lock()
	defer p.mm.Unlock()
	var err error
	for id, m := range p.mm.maps {
		err = errors.Join(err, syscall.Munmap(m))
		delete(p.mm.maps, id)
	}
	p.mm.closed = true
	return err
}

// close waits for the tasks of the peer, then hangs up and unmaps.
func (p *peer) close() error {
	p.refs.Wait()
	err := p.unmap()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.err == nil {
		p.mu.err = fmt.Errorf("shm: segment %q: %w", p.name, rdma.ErrClosed)
	}
	return errors.Join(err, p.c.Close())
}

// sliceAddr returns the address of the first byte of a non-empty slice.
func sliceAddr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
