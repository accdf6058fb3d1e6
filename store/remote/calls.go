package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// Exists asks the server about each key. Invalid keys fail alone with
// store.ErrInvalidKey, without a round trip.
func (c *client) Exists(ctx context.Context, keys []string, res []store.Result) error {
	return c.batch(ctx, "exists", msgExists, keys, len(keys), nil, res)
}

// Put stores each src[i] under keys[i]. The bytes go from the caller's
// region straight to the socket; the server stores a value only once it
// has all of it and its checksum matches. A key whose exchange fails
// (the connection breaks, the server goes) reports an error wrapping
// store.ErrTransfer, and may or may not be stored. Per-key errors found
// without a round trip: store.ErrInvalidKey, and store.ErrInvalidRegion
// for a region that is not registered host memory or is longer than the
// server's MaxValue.
func (c *client) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	return c.batch(ctx, "put", msgPut, keys, len(src), func(i int) []rdma.Region { return src[i : i+1] }, res)
}

// PutV is Put of the concatenation of the regions src[i].
func (c *client) PutV(ctx context.Context, keys []string, src [][]rdma.Region, res []store.Result) error {
	return c.batch(ctx, "put", msgPut, keys, len(src), func(i int) []rdma.Region { return src[i] }, res)
}

// Get copies the value of each key from the socket straight into dst[i],
// and writes exactly the value's bytes; a destination shorter than the
// value is not written (store.ErrBufferTooSmall). A key whose exchange
// fails reports an error wrapping store.ErrTransfer, and its destination
// may have been written. Per-key errors found without a round trip:
// store.ErrInvalidKey, store.ErrInvalidRegion.
func (c *client) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	return c.batch(ctx, "get", msgGet, keys, len(dst), func(i int) []rdma.Region { return dst[i : i+1] }, res)
}

// GetV is Get across the regions dst[i], filled in order.
func (c *client) GetV(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result) error {
	return c.batch(ctx, "get", msgGet, keys, len(dst), func(i int) []rdma.Region { return dst[i] }, res)
}

// batch runs a batch call: it checks the keys and regions, splits the
// valid keys into requests within the server's limits, and runs them in
// order on one connection.
func (c *client) batch(ctx context.Context, op string, typ byte, keys []string, nregs int, regs func(int) []rdma.Region, res []store.Result) error {
	if regs == nil {
		nregs = -1
	}
	if err := c.start(ctx, op, len(keys), nregs, len(res)); err != nil {
		return err
	}
	defer c.exit()
	// sizes[j] is the value length (put) or destination length (get) of
	// the key idx[j]: the keys that go to the server.
	idx := make([]int, 0, len(keys))
	sizes := make([]int, 0, len(keys))
	for i, k := range keys {
		res[i] = store.Result{}
		if err := store.ValidateKey(k); err != nil {
			res[i].Err = fmt.Errorf("remote: %s: %w", op, err)
			continue
		}
		n := 0
		if regs != nil {
			role := "source"
			if typ == msgGet {
				role = "destination"
			}
			var err error
			n, err = c.checkRegions(op, k, role, regs(i))
			if err == nil && typ == msgPut && n > c.limits.MaxValue {
				err = fmt.Errorf("%w: remote: put %.64q: value of %d bytes is larger than the server's MaxValue %d", store.ErrInvalidRegion, k, n, c.limits.MaxValue)
			}
			if err != nil {
				res[i].Err = err
				continue
			}
		}
		idx = append(idx, i)
		sizes = append(sizes, n)
	}
	if len(idx) == 0 {
		return nil
	}
	cc, err := c.acquire(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		for _, i := range idx {
			res[i].Err = fmt.Errorf("%w: %w", store.ErrTransfer, err)
		}
		return nil
	}
	broken := false
	for first := 0; first < len(idx); {
		end := c.chunk(typ, sizes, first)
		if first > 0 && ctx.Err() != nil {
			fail(res, idx[first:], fmt.Errorf("remote: %s of %d keys: %w", op, len(idx)-first, ctx.Err()))
			break
		}
		callErr, err := c.request(ctx, cc, typ, keys, idx[first:end], sizes[first:end], regs, res)
		cc.finish()
		if err != nil {
			broken = true
			fail(res, idx[first:], failure(ctx, cc, op, len(idx)-first, err))
			break
		}
		if callErr != nil {
			if first == 0 {
				c.release(cc, false)
				return callErr
			}
			fail(res, idx[first:], callErr)
			break
		}
		first = end
	}
	c.release(cc, broken)
	return nil
}

func fail(res []store.Result, idx []int, err error) {
	for _, i := range idx {
		res[i] = store.Result{Err: err}
	}
}

// chunk returns the end of the request that starts at sizes[first]: at
// most MaxBatch keys and MaxCallBytes value bytes (for a get, each
// destination counted up to MaxValue).
func (c *client) chunk(typ byte, sizes []int, first int) int {
	end := min(len(sizes), first+c.limits.MaxBatch)
	if typ == msgExists {
		return end
	}
	total := 0
	for j := first; j < end; j++ {
		total += min(sizes[j], c.limits.MaxValue)
		if total > c.limits.MaxCallBytes && j > first {
			return j
		}
	}
	return end
}

// request runs one request of the keys idx, filling their results. It
// returns the call's error that the server reported, or the error of the
// exchange, after which the connection is not used again.
func (c *client) request(ctx context.Context, cc *cconn, typ byte, keys []string, idx []int, sizes []int, regs func(int) []rdma.Region, res []store.Result) (callErr, err error) {
	b := enc(cc.out[:0]).u32(uint32(len(idx)))
	data := cc.data[:0]
	for j, i := range idx {
		b = b.str(keys[i])
		switch typ {
		case msgPut:
			b = b.u64(uint64(sizes[j]))
			for _, r := range regs(i) {
				data = append(data, r.Bytes())
			}
		case msgGet:
			b = b.u64(uint64(sizes[j]))
		}
	}
	cc.out = b
	cc.data = data[:0]
	h, err := cc.roundTrip(ctx, c.opts, typ, c.nextID(), data)
	clear(data)
	if err != nil {
		return nil, err
	}
	if h.typ != msgReply || (typ != msgGet && h.data != 0) {
		return nil, fmt.Errorf("%w: reply of type %d with %d data bytes", errFrame, h.typ, h.data)
	}
	crc := crc32Of(cc.hdr[:])
	if err := cc.readBody(h, &crc); err != nil {
		return nil, err
	}
	d := dec{b: cc.body}
	callErr = callersError(ctx, decodeError(d.u8(), d.str()))
	d.u64()
	n := int(d.u32())
	if callErr != nil {
		if err := d.end(); err != nil {
			return nil, err
		}
		if n != 0 || h.data != 0 {
			return nil, fmt.Errorf("%w: a failed call with results", errFrame)
		}
		return callErr, readTrailer(cc.nc, crc)
	}
	if d.err == nil && n != len(idx) {
		return nil, fmt.Errorf("%w: %d results for %d keys", errFrame, n, len(idx))
	}
	var total uint64
	for j, i := range idx {
		code, size := d.u8(), d.u64()
		var msg string
		if code != codeOK {
			msg = d.str()
		}
		if d.err != nil {
			break
		}
		if code == codeOK && !validSize(typ, size, sizes[j]) {
			return nil, fmt.Errorf("%w: key %.64q: %d bytes reported for %d", errFrame, keys[i], size, sizes[j])
		}
		if code == codeOK {
			total += size
			res[i] = store.Result{N: int(size)}
		} else {
			res[i] = store.Result{Err: callersError(ctx, decodeError(code, msg))}
		}
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	if typ == msgGet {
		if total != h.data {
			return nil, fmt.Errorf("%w: %d data bytes for values of %d", errFrame, h.data, total)
		}
		for _, i := range idx {
			if res[i].Err == nil {
				if err := scatter(cc.nc, regs(i), res[i].N, &crc); err != nil {
					return nil, err
				}
			}
		}
	}
	return nil, readTrailer(cc.nc, crc)
}

// validSize reports whether size, the N of a key's success in a reply to
// a request of typ, can be true: a get's value fits its destination of
// want bytes, and a put's is the want bytes sent. An exists may report
// any size, 0 included: a store that reports presence only does (see
// store.Store's Exists).
func validSize(typ byte, size uint64, want int) bool {
	switch typ {
	case msgGet:
		return size >= 1 && size <= uint64(want)
	case msgPut:
		return size >= 1 && size == uint64(want)
	}
	return size <= math.MaxInt
}

// scatter reads n bytes into the regions rs, in order.
func scatter(r io.Reader, rs []rdma.Region, n int, crc *uint32) error {
	for _, reg := range rs {
		if n == 0 {
			break
		}
		b := reg.Bytes()
		b = b[:min(len(b), n)]
		if err := readFull(r, b, crc); err != nil {
			return err
		}
		n -= len(b)
	}
	return nil
}

// Remove removes key on the server.
func (c *client) Remove(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := store.ValidateKey(key); err != nil {
		if err := c.enter(); err != nil {
			return err
		}
		c.exit()
		return fmt.Errorf("remote: remove: %w", err)
	}
	_, err := c.remove(ctx, "remove", msgRemove, key)
	return err
}

// RemovePrefix removes every key that starts with prefix on the server,
// and returns how many it removed, as the served store counts them.
func (c *client) RemovePrefix(ctx context.Context, prefix string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	switch {
	case prefix == "":
		if err := c.enter(); err != nil {
			return 0, err
		}
		c.exit()
		return 0, fmt.Errorf("remote: remove prefix: empty prefix: use RemoveAll")
	case len(prefix) > store.MaxKeyLen:
		if err := c.enter(); err != nil {
			return 0, err
		}
		c.exit()
		return 0, nil // no key is that long
	}
	return c.remove(ctx, "remove prefix", msgRemovePrefix, prefix)
}

// RemoveAll removes every key on the server.
func (c *client) RemoveAll(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return c.remove(ctx, "remove all", msgRemoveAll, "")
}

func (c *client) remove(ctx context.Context, op string, typ byte, arg string) (int, error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.exit()
	cc, err := c.acquire(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, fmt.Errorf("%w: %w", store.ErrTransfer, err)
	}
	n, err := c.removeOn(ctx, cc, typ, arg)
	cc.finish()
	if err != nil {
		c.release(cc, true)
		return 0, failure(ctx, cc, op, 1, err)
	}
	c.release(cc, false)
	return n.count, n.err
}

// callersError returns err, an error from the server, with the error of
// the caller's context in place of the server's cancellation: the server
// cancels a request when the client asks it to, whether the caller's
// context was canceled or its deadline passed, and the caller must see
// which.
func callersError(ctx context.Context, err error) error {
	var se *serverError
	if cerr := ctx.Err(); cerr != nil && errors.As(err, &se) && errors.Is(se.err, context.Canceled) {
		return &serverError{msg: se.msg, err: cerr}
	}
	return err
}

type removed struct {
	count int
	err   error
}

func (c *client) removeOn(ctx context.Context, cc *cconn, typ byte, arg string) (removed, error) {
	b := enc(cc.out[:0])
	if typ != msgRemoveAll {
		b = b.str(arg)
	}
	cc.out = b
	h, err := cc.roundTrip(ctx, c.opts, typ, c.nextID(), nil)
	if err != nil {
		return removed{}, err
	}
	if h.typ != msgReply || h.data != 0 {
		return removed{}, fmt.Errorf("%w: reply of type %d with %d data bytes", errFrame, h.typ, h.data)
	}
	crc := crc32Of(cc.hdr[:])
	if err := cc.readBody(h, &crc); err != nil {
		return removed{}, err
	}
	d := dec{b: cc.body}
	r := removed{err: callersError(ctx, decodeError(d.u8(), d.str())), count: int(d.u64())}
	if n := d.u32(); n != 0 {
		return removed{}, fmt.Errorf("%w: %d results for a removal", errFrame, n)
	}
	if err := d.end(); err != nil {
		return removed{}, err
	}
	return r, readTrailer(cc.nc, crc)
}
