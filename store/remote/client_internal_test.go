package remote

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/kvconnect/kvconnect/store"
)

// innerClient returns the *client behind c.
func innerClient(t *testing.T, c Client) *client {
	t.Helper()
	switch c := c.(type) {
	case *client:
		return c
	case *leaserClient:
		return c.client
	}
	t.Fatalf("Dial returned a %T", c)
	return nil
}

// TestCallIDWrap runs calls across the wrap-around of the client's call
// ids: every call is served, none is taken for one a cancel named.
func TestCallIDWrap(t *testing.T) {
	r := newRig(t)
	cl, err := Dial(context.Background(), "unix", r.path, ClientOptions{Conns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c := innerClient(t, cl)
	c.ids.Store(math.MaxUint32 - 2)
	res := make([]store.Result, 1)
	for i := range 5 {
		id := c.ids.Load()
		if err := cl.Exists(context.Background(), []string{"wrap"}, res); err != nil || !errors.Is(res[0].Err, store.ErrNotFound) {
			t.Errorf("Exists(wrap) after call id %d = %v, %+v; want store.ErrNotFound", id, err, res[0])
		}
		if i == 4 && c.ids.Load() > 10 {
			t.Errorf("call ids did not wrap around: the last is %d", c.ids.Load())
		}
	}
}

// TestNextID: the ids of calls skip 0 when they wrap around.
func TestNextID(t *testing.T) {
	var c client
	c.ids.Store(math.MaxUint32 - 1)
	for _, want := range []uint32{math.MaxUint32, 1, 2} {
		if got := c.nextID(); got != want {
			t.Errorf("nextID() = %d, want %d", got, want)
		}
	}
}

// TestRequestIDZero sends a request of id 0 on a new connection: the
// server serves it; no cancel named it.
func TestRequestIDZero(t *testing.T) {
	r := newRig(t)
	nc := r.conn(t)
	if _, err := nc.Write(frame(msgExists, 0, enc(nil).u32(1).str("zero"), nil)); err != nil {
		t.Fatal(err)
	}
	h, body := readFrame(t, nc)
	d := dec{b: body}
	code, msg := d.u8(), d.str()
	if h.typ != msgReply || h.id != 0 || code != codeOK {
		t.Errorf("reply to an exists of id 0 = type %d id %d code %d %q, want a reply of id 0 with code 0", h.typ, h.id, code, msg)
	}
}
