// Package zmtp is the small subset of ZMTP 3.0 (https://rfc.zeromq.org/spec/23/)
// that the KV event publisher needs: the NULL security mechanism, a PUB
// socket and a ROUTER socket that bind a TCP address, and a client
// connection that tests use as a SUB or DEALER peer. It interoperates with
// libzmq 4.x peers (pyzmq), which speak ZMTP 3.0 to a peer that announces
// 3.0.
//
// A PUB socket also connects, reconnecting with backoff (DialPub), for a
// SUB peer that binds. Every socket bounds what its peers may send and
// hold (Limits, SocketLimits) and drops, and counts, a peer over a bound.
//
// Not implemented: CURVE and PLAIN, and socket types other than PUB,
// ROUTER (server side), SUB and DEALER (client side, for tests).
package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"
)

// ErrClosed is returned by the operations of a closed socket.
var ErrClosed = errors.New("zmtp: socket closed")

const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04

	greetingLen = 64
	// handshakeTimeout bounds the greeting and READY exchange of a new
	// connection, so that a silent peer cannot hold a goroutine.
	handshakeTimeout = 10 * time.Second
	// handshakeFrame bounds the peer's READY command: a socket type and an
	// identity of up to 255 bytes, with room for other properties.
	handshakeFrame = 8 << 10
)

// compatible lists, for each socket type, the peer types it accepts
// (ZMTP 3.0, "Socket types").
var compatible = map[string][]string{
	"PUB":    {"SUB", "XSUB"},
	"SUB":    {"PUB", "XPUB"},
	"ROUTER": {"DEALER", "REQ", "ROUTER"},
	"DEALER": {"ROUTER", "DEALER", "REP"},
}

// Conn is one ZMTP connection after its handshake. ReadMsg may be called
// from one goroutine at a time and WriteMsg from another.
type Conn struct {
	nc       net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	PeerType string // the peer's Socket-Type
	Identity []byte // the peer's Identity property, empty when none
	// Limits bound what ReadMsg accepts; Handshake sets DefaultLimits.
	Limits Limits
}

// Limits bound the messages a connection reads. A message over a bound
// ends the read with an error that wraps ErrBound.
type Limits struct {
	Frame  int // bytes of one frame (commands included)
	Bytes  int // bytes of one message, all its frames together
	Frames int // frames of one message
	// MsgTimeout, when > 0, bounds the time from a message's first byte to
	// its last: a peer cannot hold a reader with half a message.
	MsgTimeout time.Duration
}

// DefaultLimits are the limits of a connection that Handshake returns.
var DefaultLimits = Limits{Frame: 1 << 20, Bytes: 4 << 20, Frames: 16}

// ErrBound is wrapped by the errors of a message over a connection's
// Limits.
var ErrBound = errors.New("zmtp: over a bound")

// ErrProtocol is wrapped by the errors of bytes that break ZMTP.
var ErrProtocol = errors.New("zmtp: protocol error")

// Handshake exchanges greetings and READY commands over nc as a socket of
// type socketType, announcing identity (may be nil), and checks that the
// peer is of a compatible type. It does not close nc on error.
func Handshake(nc net.Conn, socketType string, identity []byte) (*Conn, error) {
	if _, ok := compatible[socketType]; !ok {
		return nil, fmt.Errorf("zmtp: socket type %q not supported", socketType)
	}
	c := &Conn{nc: nc, br: bufio.NewReader(nc), bw: bufio.NewWriter(nc), Limits: DefaultLimits}
	if err := nc.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return nil, err
	}
	var g [greetingLen]byte
	g[0], g[8], g[9] = 0xff, 0x01, 0x7f
	g[10], g[11] = 3, 0 // ZMTP 3.0
	copy(g[12:32], "NULL")
	if _, err := nc.Write(g[:]); err != nil {
		return nil, fmt.Errorf("zmtp: write greeting: %w", err)
	}
	var pg [greetingLen]byte
	if _, err := io.ReadFull(c.br, pg[:]); err != nil {
		return nil, fmt.Errorf("zmtp: read greeting: %w", err)
	}
	if pg[0] != 0xff || pg[9]&1 != 1 {
		return nil, fmt.Errorf("%w: the peer greeting has no ZMTP signature", ErrProtocol)
	}
	if pg[10] < 3 {
		return nil, fmt.Errorf("%w: the peer speaks ZMTP %d.%d, want 3.0 or later", ErrProtocol, pg[10], pg[11])
	}
	if mech := string(bytes.TrimRight(pg[12:32], "\x00")); mech != "NULL" {
		return nil, fmt.Errorf("%w: the peer security mechanism %q, want NULL", ErrProtocol, mech)
	}
	var ready []byte
	ready = appendProperty(ready, "Socket-Type", []byte(socketType))
	if socketType == "ROUTER" || socketType == "DEALER" {
		ready = appendProperty(ready, "Identity", identity)
	}
	if err := c.writeCommand("READY", ready); err != nil {
		return nil, err
	}
	if err := c.bw.Flush(); err != nil {
		return nil, fmt.Errorf("zmtp: write READY: %w", err)
	}
	c.Limits.Frame = handshakeFrame
	name, body, err := c.readCommand()
	c.Limits.Frame = DefaultLimits.Frame
	if err != nil {
		return nil, err
	}
	if name != "READY" {
		return nil, fmt.Errorf("%w: the peer sent %q, want READY", ErrProtocol, name)
	}
	props, err := parseProperties(body)
	if err != nil {
		return nil, err
	}
	c.PeerType = string(props["socket-type"])
	c.Identity = props["identity"]
	ok := false
	for _, t := range compatible[socketType] {
		ok = ok || t == c.PeerType
	}
	if !ok {
		return nil, fmt.Errorf("%w: a %s socket does not accept a %q peer", ErrProtocol, socketType, c.PeerType)
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return c, nil
}

// Dial connects to endpoint (tcp://host:port) as a socket of type
// socketType (SUB or DEALER) and completes the handshake.
func Dial(ctx context.Context, endpoint, socketType string, identity []byte) (*Conn, error) {
	addr, err := TCPAddr(endpoint)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: dial %s: %w", endpoint, err)
	}
	c, err := Handshake(nc, socketType, identity)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// TCPAddr returns the host:port of a tcp://host:port endpoint.
func TCPAddr(endpoint string) (string, error) {
	addr, ok := cutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("zmtp: endpoint %q: only tcp://host:port is supported", endpoint)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("zmtp: endpoint %q: %v", endpoint, err)
	}
	if host == "*" {
		host = "" // all interfaces, as libzmq reads "*"
	}
	return net.JoinHostPort(host, port), nil
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):], true
	}
	return s, false
}

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// SetDeadline sets the read and write deadline of the connection.
func (c *Conn) SetDeadline(t time.Time) error { return c.nc.SetDeadline(t) }

// ReadMsg returns the next message, its frames in order. Commands that
// arrive in between are handled (PING is answered) or, for SUBSCRIBE and
// CANCEL (ZMTP 3.1), returned as the one-frame messages of ZMTP 3.0
// (0x01 or 0x00 then the topic); others, PING among them, are skipped
// (heartbeats are not implemented: a peer that requires PONG replies
// drops the connection). A message over c.Limits is an error wrapping
// ErrBound; the connection is then unusable.
func (c *Conn) ReadMsg() ([][]byte, error) { return c.readMsg(-1) }

// readMsg reads one message as ReadMsg does. With keep >= 0 it buffers
// only a message of one frame of at most keep bytes (a subscription) and
// returns nil for any other, whose frames it discards as they arrive,
// never holding more than its reader's buffer of them; the bounds of
// c.Limits hold either way.
func (c *Conn) readMsg(keep int) ([][]byte, error) {
	var frames [][]byte
	total, n := 0, 0
	discard := false
	for {
		flags, size, err := c.readHeader(n == 0)
		if err != nil {
			return nil, err
		}
		if flags&flagCommand != 0 {
			if n > 0 {
				return nil, fmt.Errorf("%w: a command inside a multipart message", ErrProtocol)
			}
			body, err := c.readBody(size)
			if err != nil {
				return nil, err
			}
			name, data, err := splitCommand(body)
			if err != nil {
				return nil, err
			}
			switch name {
			case "SUBSCRIBE":
				return [][]byte{append([]byte{1}, data...)}, nil
			case "CANCEL":
				return [][]byte{append([]byte{0}, data...)}, nil
			}
			continue
		}
		n++
		total += int(size) // size <= Limits.Frame: no overflow
		if n > c.Limits.Frames {
			return nil, fmt.Errorf("%w: a message of more than %d frames", ErrBound, c.Limits.Frames)
		}
		if total > c.Limits.Bytes {
			return nil, fmt.Errorf("%w: a message of more than %d bytes", ErrBound, c.Limits.Bytes)
		}
		more := flags&flagMore != 0
		if keep >= 0 && (more || n > 1 || size > uint64(keep)) {
			discard = true
		}
		if discard {
			if _, err := c.br.Discard(int(size)); err != nil { // size <= Limits.Frame
				return nil, err
			}
		} else {
			body, err := c.readBody(size)
			if err != nil {
				return nil, err
			}
			frames = append(frames, body)
		}
		if !more {
			if discard {
				return nil, nil
			}
			return frames, nil
		}
	}
}

// readHeader reads the flags and the size of the next frame, checked
// against Limits.Frame. At the start of a message (first) it arms
// Limits.MsgTimeout once the first byte is in.
func (c *Conn) readHeader(first bool) (byte, uint64, error) {
	flags, err := c.br.ReadByte()
	if err != nil {
		return 0, 0, err
	}
	if first && c.Limits.MsgTimeout > 0 && c.nc != nil {
		if err := c.nc.SetReadDeadline(time.Now().Add(c.Limits.MsgTimeout)); err != nil {
			return 0, 0, err
		}
	}
	var size uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(c.br, b[:]); err != nil {
			return 0, 0, err
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := c.br.ReadByte()
		if err != nil {
			return 0, 0, err
		}
		size = uint64(b)
	}
	if size > uint64(c.Limits.Frame) {
		return 0, 0, fmt.Errorf("%w: a frame of %d bytes, over the limit of %d", ErrBound, size, c.Limits.Frame)
	}
	return flags, size, nil
}

// readBody reads a frame body of size bytes, size checked by readHeader.
// A large body grows as its bytes arrive, so that a peer that announces a
// frame and sends less of it makes the reader hold no more than about
// twice what it sent.
func (c *Conn) readBody(size uint64) ([]byte, error) {
	if size <= bodyChunk {
		body := make([]byte, size)
		if _, err := io.ReadFull(c.br, body); err != nil {
			return nil, err
		}
		return body, nil
	}
	body := make([]byte, 0, bodyChunk)
	for uint64(len(body)) < size {
		if len(body) == cap(body) {
			body = slices.Grow(body, min(int(size)-len(body), cap(body)))
		}
		n, err := c.br.Read(body[len(body):min(cap(body), int(size))])
		body = body[:len(body)+n]
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return body, nil
}

// bodyChunk is the size up to which a frame body is allocated at once.
const bodyChunk = 4 << 10

// WriteCommand writes one command and flushes it. It must not be called
// concurrently with WriteMsg.
func (c *Conn) WriteCommand(name string, data []byte) error {
	if err := c.writeCommand(name, data); err != nil {
		return err
	}
	return c.bw.Flush()
}

// WriteRaw writes b as it is and flushes it, for tests of peers that
// break the protocol. It must not be called concurrently with WriteMsg.
func (c *Conn) WriteRaw(b []byte) error {
	if _, err := c.bw.Write(b); err != nil {
		return err
	}
	return c.bw.Flush()
}

// WriteMsg writes one message of frames (at least one) and, unless more
// is set, flushes it.
func (c *Conn) WriteMsg(frames [][]byte) error {
	if err := c.writeMsg(frames); err != nil {
		return err
	}
	return c.bw.Flush()
}

func (c *Conn) writeMsg(frames [][]byte) error {
	if len(frames) == 0 {
		return errors.New("zmtp: a message has at least one frame")
	}
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags |= flagMore
		}
		if err := c.writeFrame(flags, f); err != nil {
			return err
		}
	}
	return nil
}

func (c *Conn) writeFrame(flags byte, body []byte) error {
	var hdr [9]byte
	n := 2
	if len(body) > 255 {
		flags |= flagLong
		binary.BigEndian.PutUint64(hdr[1:], uint64(len(body)))
		n = 9
	} else {
		hdr[1] = byte(len(body))
	}
	hdr[0] = flags
	if _, err := c.bw.Write(hdr[:n]); err != nil {
		return err
	}
	_, err := c.bw.Write(body)
	return err
}

func (c *Conn) writeCommand(name string, data []byte) error {
	body := make([]byte, 0, 1+len(name)+len(data))
	body = append(body, byte(len(name)))
	body = append(body, name...)
	body = append(body, data...)
	return c.writeFrame(flagCommand, body)
}

func (c *Conn) readFrame() (byte, []byte, error) {
	flags, size, err := c.readHeader(false)
	if err != nil {
		return 0, nil, err
	}
	body, err := c.readBody(size)
	return flags, body, err
}

func (c *Conn) readCommand() (string, []byte, error) {
	flags, body, err := c.readFrame()
	if err != nil {
		return "", nil, fmt.Errorf("zmtp: read command: %w", err)
	}
	if flags&flagCommand == 0 {
		return "", nil, fmt.Errorf("%w: the peer sent a message before READY", ErrProtocol)
	}
	return splitCommand(body)
}

func splitCommand(body []byte) (string, []byte, error) {
	if len(body) < 1 || len(body) < 1+int(body[0]) {
		return "", nil, fmt.Errorf("%w: malformed command", ErrProtocol)
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], nil
}

func appendProperty(b []byte, name string, value []byte) []byte {
	b = append(b, byte(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

// parseProperties returns the metadata of a READY command, names in lower
// case (they are case-insensitive).
func parseProperties(b []byte) (map[string][]byte, error) {
	props := map[string][]byte{}
	for len(b) > 0 {
		n := int(b[0])
		if len(b) < 1+n+4 {
			return nil, fmt.Errorf("%w: malformed READY metadata", ErrProtocol)
		}
		name := bytes.ToLower(b[1 : 1+n])
		vn := binary.BigEndian.Uint32(b[1+n:])
		b = b[1+n+4:]
		if uint64(len(b)) < uint64(vn) {
			return nil, fmt.Errorf("%w: malformed READY metadata", ErrProtocol)
		}
		props[string(name)] = b[:vn]
		b = b[vn:]
	}
	return props, nil
}
