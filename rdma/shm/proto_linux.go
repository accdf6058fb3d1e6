package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// The protocol between an engine that submits requests (the client) and
// the engine whose segment they reach (the owner), over a Unix
// SOCK_SEQPACKET connection, one message per packet, integers little
// endian. The client sends one message at a time and reads its reply
// before the next, except release, which has none.
//
//	grant   client: 1, u32 n, n x (u64 addr, u64 len)
//	        owner:  1, u64 grant id, n x (u8 ok, u64 memory id, u64 offset)
//	release client: 2, u64 grant id
//	map     client: 3, u64 memory id
//	        owner:  3, u8 ok, u64 size; with the memory file (SCM_RIGHTS) when ok
//
// A grant holds each range it granted registered until its release (or
// the connection's end): the owner's Unregister and Close wait for it.
const (
	opGrant   = 1
	opRelease = 2
	opMap     = 3

	maxGrant = 1024                // ranges per grant
	bufSize  = 1 + 8 + maxGrant*17 // the largest message
)

var le = binary.LittleEndian

var errProtocol = errors.New("shm: protocol error")

// accept serves peers until the listener closes.
func (e *Engine) accept() {
	defer e.serving.Done()
	for {
		c, err := e.ln.AcceptUnix()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, say: wait a little, as net/http does,
			// rather than spin.
			e.opts.Logger.Warn("shm: accept", "segment", e.name, "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if uid, err := peerUID(c); err != nil || uid != e.uid {
			e.opts.Logger.Warn("shm: refused a peer of another user", "segment", e.name, "uid", uid, "want", e.uid, "err", err, "close", c.Close())
			continue
		}
		e.reg.Lock()
		if e.reg.closed {
			e.reg.Unlock()
			if err := c.Close(); err != nil {
				e.opts.Logger.Debug("shm: close a connection", "segment", e.name, "err", err)
			}
			return
		}
		e.reg.conns[c] = struct{}{}
		e.serving.Add(1)
		e.reg.Unlock()
		go e.serve(c)
	}
}

// serve answers one peer's messages until it hangs up or the engine
// closes, then drops the peer's grants.
func (e *Engine) serve(c *net.UnixConn) {
	defer e.serving.Done()
	grants := make(map[uint64][]uintptr)
	defer func() {
		e.reg.Lock()
		delete(e.reg.conns, c)
		for _, addrs := range grants {
			e.ungrant(addrs)
		}
		e.reg.Unlock()
		if err := c.Close(); err != nil {
			e.opts.Logger.Debug("shm: close a connection", "segment", e.name, "err", err)
		}
	}()
	buf := make([]byte, bufSize)
	for {
		n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
		if err != nil || n == 0 {
			return // hung up, died, or the engine closes
		}
		if flags&syscall.MSG_TRUNC != 0 {
			e.opts.Logger.Warn("shm: a peer's message is too long", "segment", e.name)
			return
		}
		reply, fd, err := e.handle(buf[:n], grants)
		if err != nil {
			e.opts.Logger.Warn("shm: a peer's message", "segment", e.name, "err", err)
			return
		}
		if reply == nil {
			continue
		}
		var oob []byte
		if fd >= 0 {
			oob = syscall.UnixRights(fd)
		}
		_, _, err = c.WriteMsgUnix(reply, oob, nil)
		if fd >= 0 {
			if cerr := syscall.Close(fd); cerr != nil {
				e.opts.Logger.Debug("shm: close a sent file", "segment", e.name, "err", cerr)
			}
		}
		if err != nil {
			return
		}
	}
}

// handle answers one message; fd, when not -1, is a file to send with the
// reply, which the caller closes.
func (e *Engine) handle(msg []byte, grants map[uint64][]uintptr) (reply []byte, fd int, err error) {
	switch msg[0] {
	case opGrant:
		if len(msg) < 5 {
			return nil, -1, fmt.Errorf("%w: grant of %d bytes", errProtocol, len(msg))
		}
		n := int(le.Uint32(msg[1:]))
		if n > maxGrant || len(msg) != 5+16*n {
			return nil, -1, fmt.Errorf("%w: grant of %d ranges in %d bytes", errProtocol, n, len(msg))
		}
		reply = make([]byte, 9+17*n)
		reply[0] = opGrant
		var addrs []uintptr
		e.reg.Lock()
		e.reg.nextID++
		id := e.reg.nextID
		for i := range n {
			addr, size := uintptr(le.Uint64(msg[5+16*i:])), le.Uint64(msg[13+16*i:])
			if e.reg.closed || size == 0 || size > uint64(^uint(0)>>1) {
				continue
			}
			r, ok := e.reg.set.Find(addr, int(size))
			if !ok {
				continue
			}
			m := e.memOf(r)
			if m == nil {
				continue
			}
			e.reg.grants[r.Addr]++
			addrs = append(addrs, r.Addr)
			out := reply[9+17*i:]
			out[0] = 1
			le.PutUint64(out[1:], m.id)
			le.PutUint64(out[9:], uint64(addr-m.addr))
		}
		e.reg.Unlock()
		le.PutUint64(reply[1:], id)
		if len(addrs) > 0 {
			grants[id] = addrs
		}
		return reply, -1, nil
	case opRelease:
		if len(msg) != 9 {
			return nil, -1, fmt.Errorf("%w: release of %d bytes", errProtocol, len(msg))
		}
		id := le.Uint64(msg[1:])
		if addrs, ok := grants[id]; ok {
			delete(grants, id)
			e.reg.Lock()
			e.ungrant(addrs)
			e.reg.Unlock()
		}
		return nil, -1, nil
	case opMap:
		if len(msg) != 9 {
			return nil, -1, fmt.Errorf("%w: map of %d bytes", errProtocol, len(msg))
		}
		reply = make([]byte, 10)
		reply[0] = opMap
		e.reg.Lock()
		defer e.reg.Unlock()
		m := e.reg.mems[le.Uint64(msg[1:])]
		if m == nil {
			return reply, -1, nil
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.mu.mem == nil {
			return reply, -1, nil
		}
		// A duplicate, so that a Free meanwhile cannot close the file
		// (and another take its number) before it is sent.
		fd, err := fcntl(m.mu.fd, syscall.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			e.opts.Logger.Warn("shm: duplicate a memory file", "segment", e.name, "err", err)
			return reply, -1, nil
		}
		reply[1] = 1
		le.PutUint64(reply[2:], uint64(len(m.mu.mem)))
		return reply, fd, nil
	}
	return nil, -1, fmt.Errorf("%w: message type %d", errProtocol, msg[0])
}

// ungrant withdraws one grant of each region that starts at addrs. e.reg
// is held.
func (e *Engine) ungrant(addrs []uintptr) {
	for _, a := range addrs {
		if e.reg.grants[a]--; e.reg.grants[a] <= 0 {
			delete(e.reg.grants, a)
		}
	}
	e.reg.cond.Broadcast()
}
