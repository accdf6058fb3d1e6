package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// Defaults that [ClientOptions.EnsureDefaults] fills in.
const (
	DefaultConns       = 4
	DefaultCallTimeout = time.Minute
	DefaultCancelWait  = 5 * time.Second
)

// ClientOptions configures a client made by [Dial]. The zero value of
// every field means its default.
type ClientOptions struct {
	// Conns is the most connections the client keeps to the server. Each
	// call in flight takes one for its whole duration, so Conns calls run
	// at once; more wait for a connection to be free. Default 4.
	Conns int
	// CallTimeout bounds each request's exchange with the server, beside
	// the caller's context: a server that does not answer within it fails
	// the request's keys with store.ErrTransfer. Default one minute.
	CallTimeout time.Duration
	// CancelWait is how long a call whose context ends while the server
	// runs it waits for the server's answer to the cancellation, which
	// says what the call did; past it the connection is dropped and the
	// keys not answered report the context's error. Default 5 s. It does
	// not apply to Dial, nor to the start of a connection, which end with
	// their context.
	CancelWait time.Duration
	// Secret is the shared secret of the server (see ServerOptions.Secret
	// and "Security" in the package doc): the client proves it holds it,
	// and refuses a server that does not prove the same. Dial refuses a
	// network other than "unix" without one. If empty, EnsureDefaults
	// takes the value of the environment variable [SecretEnv]. At least
	// [MinSecretLen] bytes.
	Secret Secret
}

// EnsureDefaults sets every zero field of o to its default.
func (o *ClientOptions) EnsureDefaults() {
	if o.Conns == 0 {
		o.Conns = DefaultConns
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.CancelWait == 0 {
		o.CancelWait = DefaultCancelWait
	}
	o.Secret = secretFromEnv(o.Secret)
}

// Validate reports the first field of o that is out of range, naming the
// field and its value. Call EnsureDefaults first.
func (o *ClientOptions) Validate() error {
	switch {
	case o.Conns < 1 || o.Conns > 1024:
		return fmt.Errorf("remote: client options: Conns %d: must be in [1, 1024]", o.Conns)
	case o.CallTimeout < 0:
		return fmt.Errorf("remote: client options: CallTimeout %v: must not be negative", o.CallTimeout)
	case o.CancelWait < 0:
		return fmt.Errorf("remote: client options: CancelWait %v: must not be negative", o.CancelWait)
	}
	return checkSecret("client", o.Secret)
}

// Limits are what a server told a client when it connected.
type Limits struct {
	MaxValue     int // largest value a put may store, in bytes
	MaxBatch     int // most keys per request; the client splits larger batches
	MaxCallBytes int // most value bytes per request; the client splits larger batches
	// Leases is the served store's store.Leaser declaration, when Leaser
	// is set.
	Leases store.Leases
	Leaser bool
	// Watcher says whether the served store is a store.Watcher, and so
	// the client.
	Watcher bool
}

// Client is a [store.Store] served by a [Server], made by [Dial]. It
// implements [store.Vectored], and [store.Leaser] and [store.Watcher]
// each exactly when the served store does. It is safe for concurrent use.
type Client interface {
	store.Store
	store.Vectored
	// Limits returns what the server said when the client connected.
	Limits() Limits
}

var (
	_ Client        = (*client)(nil)
	_ Client        = (*leaserClient)(nil)
	_ store.Leaser  = (*leaserClient)(nil)
	_ Client        = (*watcherClient)(nil)
	_ store.Watcher = (*watcherClient)(nil)
	_ Client        = (*leaserWatcherClient)(nil)
	_ store.Leaser  = (*leaserWatcherClient)(nil)
	_ store.Watcher = (*leaserWatcherClient)(nil)
)

// client is the Client of a store that is not a store.Leaser.
type client struct {
	network, address string
	opts             ClientOptions
	limits           Limits
	ids              atomic.Uint32
	slots            chan struct{} // one per connection that may exist

	life struct {
		sync.RWMutex
		closed bool
	}
	regs struct {
		sync.RWMutex
		set rdma.RegionSet
	}
	pool struct {
		sync.Mutex
		idle []*cconn
	}
	stats struct {
		sync.Mutex
		last store.Stats
	}
	// closing ends when Close starts: the context of a watch's dials.
	closing     context.Context
	closeCancel context.CancelFunc
	watches     struct {
		sync.Mutex
		set map[*cwatch]struct{}
		wg  sync.WaitGroup
	}
}

// leaserClient is the Client of a store.Leaser.
type leaserClient struct{ *client }

// Leases returns the served store's declaration, as the server sent it.
func (c *leaserClient) Leases() store.Leases { return c.limits.Leases }

// watcherClient is the Client of a store.Watcher.
type watcherClient struct{ *client }

// Watch starts a feed of the served store's key events: see
// [store.Watcher] and "Key events" in the package doc.
func (c *watcherClient) Watch(n int) (*store.Feed, error) { return c.watch(n) }

// leaserWatcherClient is the Client of a store.Leaser and store.Watcher.
type leaserWatcherClient struct{ *client }

// Leases returns the served store's declaration, as the server sent it.
func (c *leaserWatcherClient) Leases() store.Leases { return c.limits.Leases }

// Watch starts a feed of the served store's key events: see
// [store.Watcher] and "Key events" in the package doc.
func (c *leaserWatcherClient) Watch(n int) (*store.Feed, error) { return c.watch(n) }

// Dial connects to the server listening at address on network ("unix" or
// "tcp", as for net.Dial), and returns a client of the store it serves.
// It makes one connection and its handshake, within ctx (it returns as
// soon as ctx ends, with ctx's error, whatever CancelWait), and returns an
// error wrapping store.ErrUnavailable when that fails; later connections
// are made when calls need them. opts' zero fields take their defaults; a
// field out of range is an error naming it. A network other than "unix"
// without [ClientOptions.Secret] is refused before anything is sent.
func Dial(ctx context.Context, network, address string, opts ClientOptions) (Client, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if needsSecret(network) && len(opts.Secret) == 0 {
		return nil, fmt.Errorf("remote: dial %s %s: refused: a %s connection needs a shared secret (ClientOptions.Secret or %s), as only a unix socket is kept to its owner", network, address, network, SecretEnv)
	}
	c := &client{network: network, address: address, opts: opts, slots: make(chan struct{}, opts.Conns)}
	cc, lim, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.limits = lim
	c.pool.idle = append(c.pool.idle, cc)
	c.closing, c.closeCancel = context.WithCancel(context.Background())
	c.watches.set = make(map[*cwatch]struct{})
	switch {
	case lim.Leaser && lim.Watcher:
		return &leaserWatcherClient{c}, nil
	case lim.Leaser:
		return &leaserClient{c}, nil
	case lim.Watcher:
		return &watcherClient{c}, nil
	}
	return c, nil
}

// Limits returns what the server said at the handshake.
func (c *client) Limits() Limits { return c.limits }

// cconn is one connection of a client, used by one call at a time.
type cconn struct {
	nc   net.Conn
	hdr  [headerLen]byte
	out  enc
	body []byte
	bufs net.Buffers
	data [][]byte
	// maxReply is the longest reply body accepted: what the server's
	// MaxBatch results can take.
	maxReply uint32
	stop     func() bool // stops the call's context watcher

	// mu guards the call's phase against the context's watcher.
	mu struct {
		sync.Mutex
		id         uint32
		phase      int
		canceled   bool // the call's context ended
		cancelSent bool // and the server was told while it ran the call
	}
}

// The phases of a call on a connection.
const (
	phaseIdle = iota
	phaseSend // writing the request
	phaseWait // waiting for the reply's header: a cancel is sent to the server
	phaseRecv // reading the reply
)

// dial makes a connection and its handshake, within ctx: the handshake
// has CallTimeout at most, and ends at once when ctx does.
func (c *client) dial(ctx context.Context) (*cconn, Limits, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, c.network, c.address)
	if err != nil {
		if ctx.Err() != nil {
			return nil, Limits{}, ctx.Err()
		}
		return nil, Limits{}, fmt.Errorf("%w: remote: dial %s %s: %v", store.ErrUnavailable, c.network, c.address, err)
	}
	cc := &cconn{nc: nc, maxReply: 1 << 16}
	var deadline time.Time
	if c.opts.CallTimeout > 0 {
		deadline = time.Now().Add(c.opts.CallTimeout)
	}
	ctxDeadline := false // the deadline is ctx's: its timeout is ctx's end
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline, ctxDeadline = d, true
	}
	err = nc.SetDeadline(deadline)
	var lim Limits
	if err == nil {
		stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) }) // ends the handshake's read or write at once
		lim, err = cc.hello(c.opts.Secret, c.nextID)
		if !stop() {
			err = ctx.Err()
		}
	}
	if err == nil {
		err = nc.SetDeadline(time.Time{})
	}
	if err != nil {
		_ = nc.Close() // the handshake's error says why
		if ctx.Err() != nil {
			return nil, Limits{}, ctx.Err()
		}
		if ctxDeadline && isTimeout(err) {
			return nil, Limits{}, context.DeadlineExceeded // ctx's deadline passed; ctx is told a moment later
		}
		if isTimeout(err) {
			err = fmt.Errorf("no answer within the call timeout: %w", err)
		}
		return nil, Limits{}, fmt.Errorf("%w: remote: handshake with %s %s: %w", store.ErrUnavailable, c.network, c.address, err)
	}
	cc.maxReply = uint32(min(64+lim.MaxBatch*(1+8+2+maxMessage), 1<<30))
	return cc, lim, nil
}

// exchange writes a frame of typ and body, and reads the reply's header
// into cc.hdr, its body into cc.body, and checks its trailer.
func (cc *cconn) exchange(typ byte, id uint32, body []byte) (header, error) {
	var hdr [headerLen]byte
	putHeader(hdr[:], header{typ: typ, id: id, body: uint32(len(body))})
	if err := writeFrame(cc.nc, &cc.bufs, hdr[:], body, nil); err != nil {
		return header{}, err
	}
	if _, err := io.ReadFull(cc.nc, cc.hdr[:]); err != nil {
		return header{}, midFrame(err)
	}
	h, err := parseHeader(cc.hdr[:], cc.maxReply)
	if err != nil {
		return header{}, err
	}
	if h.id != id || h.data != 0 {
		return header{}, fmt.Errorf("%w: reply of type %d to call %d with %d data bytes, want call %d", errFrame, h.typ, h.id, h.data, id)
	}
	crc := crc32Of(cc.hdr[:])
	if err := cc.readBody(h, &crc); err != nil {
		return header{}, err
	}
	return h, readTrailer(cc.nc, crc)
}

// replyError decodes a reply to a hello or a proof, which carries no
// results: the server's error, nil if none.
func replyError(body []byte) error {
	d := dec{b: body}
	err := decodeError(d.u8(), d.str())
	d.u64()
	n := d.u32()
	if derr := d.end(); derr != nil {
		return derr
	}
	if n != 0 {
		return fmt.Errorf("%w: a reply to a hello with %d results", errFrame, n)
	}
	return err
}

// hello makes the handshake on cc: it sends the client's nonce, reads the
// server's limits and nonce, checks the server's proof of the secret and
// sends its own when the server has one. Its deadlines are the caller's.
func (cc *cconn) hello(secret Secret, nextID func() uint32) (Limits, error) {
	clientNonce := nonce()
	h, err := cc.exchange(msgHello, nextID(), clientNonce)
	if err != nil {
		return Limits{}, err
	}
	switch h.typ {
	case msgReply: // the server refused the connection, and says why
		if err := replyError(cc.body); err != nil {
			return Limits{}, err
		}
		return Limits{}, fmt.Errorf("%w: a reply to a hello with no error", errFrame)
	case msgHelloReply:
	default:
		return Limits{}, fmt.Errorf("%w: reply of type %d to a hello", errFrame, h.typ)
	}
	d := dec{b: cc.body}
	lim := Limits{MaxValue: int(d.u64()), MaxBatch: int(d.u32()), MaxCallBytes: int(d.u64()), Leaser: d.u8() == 1}
	lim.Leases = store.Leases{Exists: d.u8() == 1, Get: d.u8() == 1, TTL: time.Duration(d.u64()), RemoveWait: time.Duration(d.u64())}
	lim.Watcher = d.u8() == 1
	serverNonce := append([]byte(nil), d.take(nonceLen)...)
	auth := d.u8()
	var serverProof []byte
	if auth == 1 {
		serverProof = d.take(proofLen)
	}
	if err := d.end(); err != nil {
		return Limits{}, err
	}
	if lim.MaxValue < 1 || lim.MaxBatch < 1 || lim.MaxCallBytes < lim.MaxValue || auth > 1 {
		return Limits{}, fmt.Errorf("%w: server limits %+v, auth %d", errFrame, lim, auth)
	}
	var refused error // the client's reason to refuse the server
	switch {
	case auth == 0 && len(secret) != 0:
		return Limits{}, errors.New("remote: the server does not prove a shared secret, and ClientOptions.Secret is set: refusing a server that may not be the one meant")
	case auth == 0:
		return lim, nil
	case len(secret) == 0:
		refused = fmt.Errorf("remote: the server requires a shared secret, and the client has none (ClientOptions.Secret or %s)", SecretEnv)
	case !checkProof(serverProof, secret, labelServer, clientNonce, serverNonce):
		refused = errors.New("remote: the server's proof of the shared secret is wrong: the secrets differ, or the server is not the one meant")
	}
	// A client that refuses the server still sends a proof, of zeros, so
	// that the server learns and logs why the connection ends.
	p := make([]byte, proofLen)
	if refused == nil {
		p = proof(secret, labelClient, clientNonce, serverNonce)
	}
	h, err = cc.exchange(msgAuth, nextID(), p)
	if refused != nil {
		return Limits{}, refused
	}
	if err != nil {
		return Limits{}, err
	}
	if h.typ != msgReply {
		return Limits{}, fmt.Errorf("%w: reply of type %d to the proof of the shared secret", errFrame, h.typ)
	}
	if err := replyError(cc.body); err != nil {
		return Limits{}, err
	}
	return lim, nil
}

// acquire returns a connection for one call: an idle one, or a new one.
func (c *client) acquire(ctx context.Context) (*cconn, error) {
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	c.pool.Lock()
	if n := len(c.pool.idle); n > 0 {
		cc := c.pool.idle[n-1]
		c.pool.idle = c.pool.idle[:n-1]
		c.pool.Unlock()
		return cc, nil
	}
	c.pool.Unlock()
	cc, lim, err := c.dial(ctx)
	if err == nil && lim != c.limits {
		_ = cc.nc.Close() // refused: the server is not the one dialed
		err = fmt.Errorf("%w: remote: the server at %s %s now has limits %+v, not %+v", store.ErrUnavailable, c.network, c.address, lim, c.limits)
	}
	if err != nil {
		<-c.slots
		return nil, err
	}
	return cc, nil
}

// release returns cc after a call. A connection that failed is closed,
// and so are the idle ones, which most likely lead to the same server:
// the next calls dial again.
func (c *client) release(cc *cconn, broken bool) {
	var drop []*cconn
	c.pool.Lock()
	if broken {
		drop = append(c.pool.idle, cc)
		c.pool.idle = nil
	} else {
		c.pool.idle = append(c.pool.idle, cc)
	}
	c.pool.Unlock()
	for _, d := range drop {
		_ = d.nc.Close() // dropped: its error, if any, was the call's
	}
	<-c.slots
}

// enter starts a call: it fails with store.ErrClosed once the client is
// closed, and otherwise holds Close off until exit.
func (c *client) enter() error {
	c.life.RLock()
	if c.life.closed {
		c.life.RUnlock()
		return store.ErrClosed
	}
	return nil
}

func (c *client) exit() { c.life.RUnlock() }

func (c *client) start(ctx context.Context, op string, keys, regions, res int) error {
	if err := store.CheckBatch(op, keys, regions, res); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return c.enter()
}

// Close closes the client's connections once the calls running have
// finished; later calls return store.ErrClosed. It does not close the
// served store. Close is idempotent.
func (c *client) Close() error {
	c.life.Lock()
	defer c.life.Unlock()
	if c.life.closed {
		return nil
	}
	c.life.closed = true
	c.closeCancel()
	c.stopWatches()
	c.pool.Lock()
	idle := c.pool.idle
	c.pool.idle = nil
	c.pool.Unlock()
	var errs []error
	for _, cc := range idle {
		if err := cc.nc.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remote: close: %w", errors.Join(errs...))
	}
	return nil
}

// Register records r as memory that Put and Get may read and write. The
// client takes only memory inside registered regions, as Mooncake Store
// does: it reads and writes that memory itself, moving the bytes through
// the socket, and the server stages them in memory of its own. Only host
// memory is taken. Errors wrap store.ErrInvalidRegion.
func (c *client) Register(r rdma.Region) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	if r.Loc != rdma.Host {
		return fmt.Errorf("%w: remote: register %s: only host memory is taken", store.ErrInvalidRegion, describe(r))
	}
	c.regs.Lock()
	defer c.regs.Unlock()
	if err := c.regs.set.Add(r); err != nil {
		return fmt.Errorf("%w: remote: register %s: %v", store.ErrInvalidRegion, describe(r), err)
	}
	return nil
}

// Unregister undoes Register. Errors wrap store.ErrInvalidRegion.
func (c *client) Unregister(r rdma.Region) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	c.regs.Lock()
	defer c.regs.Unlock()
	if err := c.regs.set.Remove(r); err != nil {
		return fmt.Errorf("%w: remote: unregister %s: %v", store.ErrInvalidRegion, describe(r), err)
	}
	return nil
}

func describe(r rdma.Region) string {
	return fmt.Sprintf("region of %d bytes at %#x in %s", r.Len, r.Addr, r.Loc)
}

// checkRegions validates the regions of one key of a put or get and
// returns their total length.
func (c *client) checkRegions(op, key, role string, rs []rdma.Region) (int, error) {
	if len(rs) == 0 {
		return 0, fmt.Errorf("%w: remote: %s %.64q: no %s regions", store.ErrInvalidRegion, op, key, role)
	}
	total := 0
	c.regs.RLock()
	defer c.regs.RUnlock()
	for _, r := range rs {
		var why string
		switch {
		case r.Len <= 0:
			why = "length must be positive"
		case r.Addr == 0:
			why = "address must not be zero"
		case r.Loc != rdma.Host:
			why = "only host memory is taken"
		case r.End() < r.Addr:
			why = "wraps around the address space"
		case !c.regs.set.Contains(r):
			why = "is not inside a registered region"
		}
		if why != "" {
			return 0, fmt.Errorf("%w: remote: %s %.64q: %s %s: %s", store.ErrInvalidRegion, op, key, role, describe(r), why)
		}
		total += r.Len
	}
	return total, nil
}

// Stats returns the served store's counters, as the server reads them,
// fetched in one exchange bounded by CallTimeout. Where the server cannot
// be reached, or the client is closed, it returns the last counters it
// fetched (zero if none).
func (c *client) Stats() store.Stats {
	c.stats.Lock()
	defer c.stats.Unlock()
	if err := c.enter(); err != nil {
		return c.stats.last
	}
	defer c.exit()
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.CallTimeout)
	defer cancel()
	cc, err := c.acquire(ctx)
	if err != nil {
		return c.stats.last
	}
	cc.out = cc.out[:0]
	h, err := cc.roundTrip(ctx, c.opts, msgStats, c.nextID(), nil)
	if err == nil && (h.typ != msgStatsReply || h.data != 0 || h.body != 12*8) {
		err = fmt.Errorf("%w: reply of type %d to a stats", errFrame, h.typ)
	}
	crc := crc32Of(cc.hdr[:])
	if err == nil {
		err = cc.readBody(h, &crc)
	}
	if err == nil {
		err = readTrailer(cc.nc, crc)
	}
	cc.finish()
	c.release(cc, err != nil)
	if err != nil {
		return c.stats.last
	}
	d := dec{b: cc.body}
	v := func() int64 { return int64(d.u64()) }
	c.stats.last = store.Stats{Keys: v(), Bytes: v(), Capacity: v(), Hits: v(), Misses: v(), Exists: v(), Puts: v(), Duplicates: v(), RejectedPuts: v(), Evictions: v(), BytesIn: v(), BytesOut: v()}
	return c.stats.last
}

// roundTrip sends the request in cc.out (and data) as a frame of typ and
// id, and reads the reply's header into cc.hdr. ctx's end while the
// server runs the call is sent to the server, and the reply waited for
// CancelWait. The caller reads the rest of the reply, then calls finish.
func (cc *cconn) roundTrip(ctx context.Context, opts ClientOptions, typ byte, id uint32, data [][]byte) (header, error) {
	var total uint64
	for _, d := range data {
		total += uint64(len(d))
	}
	var deadline time.Time
	if opts.CallTimeout > 0 {
		deadline = time.Now().Add(opts.CallTimeout)
	}
	if err := cc.nc.SetDeadline(deadline); err != nil {
		return header{}, err
	}
	cc.mu.Lock()
	cc.mu.id, cc.mu.phase, cc.mu.canceled, cc.mu.cancelSent = id, phaseSend, false, false
	cc.mu.Unlock()
	cc.stop = context.AfterFunc(ctx, func() { cc.onDone(id, opts) })
	var hdr [headerLen]byte
	putHeader(hdr[:], header{typ: typ, id: id, body: uint32(len(cc.out)), data: total})
	if err := writeFrame(cc.nc, &cc.bufs, hdr[:], cc.out, data); err != nil {
		return header{}, err
	}
	cc.setPhase(phaseWait, opts)
	if _, err := io.ReadFull(cc.nc, cc.hdr[:]); err != nil {
		return header{}, err
	}
	cc.setPhase(phaseRecv, opts)
	h, err := parseHeader(cc.hdr[:], cc.maxReply)
	if err != nil {
		return header{}, err
	}
	if h.id != id {
		return header{}, fmt.Errorf("%w: reply to call %d, want %d", errFrame, h.id, id)
	}
	return h, nil
}

// onDone acts on the end of call id's context.
func (cc *cconn) onDone(id uint32, opts ClientOptions) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.mu.id != id || cc.mu.phase == phaseIdle {
		return
	}
	cc.mu.canceled = true
	cc.act(opts)
}

// act does what a canceled call does in its phase: in the middle of a
// frame it poisons the connection, so that the blocked read or write
// returns at once; waiting for the reply, it tells the server, and gives
// the reply CancelWait to come.
func (cc *cconn) act(opts ClientOptions) {
	past := time.Unix(1, 0)
	switch {
	case cc.mu.phase == phaseSend, cc.mu.phase == phaseRecv && !cc.mu.cancelSent:
		_ = cc.nc.SetDeadline(past) // the connection is dropped after the call
	case cc.mu.phase == phaseWait && !cc.mu.cancelSent:
		cc.mu.cancelSent = true
		var hdr [headerLen + trailerLen]byte
		putHeader(hdr[:], header{typ: msgCancel, id: cc.mu.id})
		crc := crc32Of(hdr[:headerLen])
		hdr[headerLen], hdr[headerLen+1], hdr[headerLen+2], hdr[headerLen+3] = byte(crc), byte(crc>>8), byte(crc>>16), byte(crc>>24)
		_ = cc.nc.SetWriteDeadline(time.Now().Add(opts.CancelWait))
		if _, err := cc.nc.Write(hdr[:]); err != nil {
			_ = cc.nc.SetDeadline(past) // the server cannot be told: give up the reply
			return
		}
		_ = cc.nc.SetReadDeadline(time.Now().Add(opts.CancelWait))
	}
}

func (cc *cconn) setPhase(p int, opts ClientOptions) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.mu.phase = p
	if cc.mu.canceled {
		cc.act(opts)
	}
}

// finish ends the call on cc, so that a late watcher does nothing.
func (cc *cconn) finish() {
	if cc.stop != nil {
		cc.stop()
		cc.stop = nil
	}
	cc.mu.Lock()
	cc.mu.phase = phaseIdle
	cc.mu.Unlock()
}

func (cc *cconn) wasCanceled() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.mu.canceled
}

// readBody reads the body of the reply of h into cc.body.
func (cc *cconn) readBody(h header, crc *uint32) error {
	if cap(cc.body) < int(h.body) {
		cc.body = make([]byte, h.body)
	}
	cc.body = cc.body[:h.body]
	return readFull(cc.nc, cc.body, crc)
}

// failure is the error of the keys of a call whose exchange failed with
// err: the context's error when it ended, store.ErrTransfer otherwise.
func failure(ctx context.Context, cc *cconn, op string, n int, err error) error {
	if cerr := ctx.Err(); cerr != nil && cc.wasCanceled() {
		return fmt.Errorf("remote: %s of %d keys: %w", op, n, cerr)
	}
	if isTimeout(err) {
		return fmt.Errorf("%w: remote: %s of %d keys: no reply within the call timeout: %v", store.ErrTransfer, op, n, err)
	}
	return fmt.Errorf("%w: remote: %s of %d keys: %v", store.ErrTransfer, op, n, err)
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// nextID returns the id of a new exchange, hello or request: the ids of
// a client count up from 1, and skip 0 when they wrap around.
func (c *client) nextID() uint32 {
	for {
		if id := c.ids.Add(1); id != 0 {
			return id
		}
	}
}
