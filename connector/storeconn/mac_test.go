package storeconn_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/store"
)

// The two tenants' secrets of these tests.
var (
	tenantKey = strings.Repeat("a1", 32)
	otherKey  = strings.Repeat("5e", 32)
)

func macExtra(key string) map[string]any {
	return map[string]any{"lookup": "sync", "verify": "mac", "verify_key": key}
}

// With verify "mac", each way the worker moves bytes round-trips a block
// byte-exact, in values of the block and a 40-byte trailer.
func TestMACRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		name   string
		wrap   func(store.Store) store.Store
		order  connector.Order
		chunks int // layer_chunks: values per block
	}{
		{"staging", func(s store.Store) store.Store { return hidden{s} }, connector.BlockMajor, 1},
		{"staging-layers", func(s store.Store) store.Store { return hidden{s} }, connector.LayerMajor, 1},
		{"vector", func(s store.Store) store.Store { return vectored{s} }, connector.BlockMajor, 1},
		{"vector-layers", func(s store.Store) store.Store { return vectored{s} }, connector.LayerMajor, 1},
		{"vector-layer-chunks", func(s store.Store) store.Store { return vectored{s} }, connector.LayerMajor, 2},
		{"staging-layer-chunks", func(s store.Store) store.Store { return hidden{s} }, connector.BlockMajor, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := newMem(t)
			st := tt.wrap(base)
			extra := macExtra(tenantKey)
			extra["layer_chunks"] = tt.chunks
			a := newRigLog(t, st, identity(1, 1), extra, tt.order, nil)
			a.fill(0x5a)
			a.saveAll(request("a", 4*bs+1))
			if tt.chunks == 1 {
				size := a.kv[0].BlockSize() + 40
				for i, v := range values(t, base, identity(1, 1), size) {
					if len(v) != size {
						t.Fatalf("value %d is %d bytes, want %d", i, len(v), size)
					}
				}
			}
			b := newRigLog(t, st, identity(1, 1), extra, tt.order, nil)
			loaded, fails := b.load("b")
			if !loaded || len(fails) > 0 {
				t.Fatalf("load: loaded %v, failures %+v", loaded, fails)
			}
			for blk := range 4 {
				for _, sp := range b.kv[0].Spans(nil, connector.BlockID(blk)) {
					off := int(sp.Addr - b.kv[0].Regions[0].Addr)
					if !bytes.Equal(b.mem[0].Bytes()[off:off+sp.Len], a.mem[0].Bytes()[off:off+sp.Len]) {
						t.Fatalf("block %d differs after the round trip", blk)
					}
				}
			}
			if st := b.ws[0].(connector.StatsReporter).Stats(); st.Loads != 4 || st.Corrupt != 0 {
				t.Errorf("Loads = %d, Corrupt = %d; want 4 and 0", st.Loads, st.Corrupt)
			}
		})
	}
}

// A writer without the tenant's secret cannot plant a value that loads
// under verify "mac": values with a valid CRC trailer, values in the MAC
// format with a MAC it made up, and values saved through a connector with
// another secret all fail as Corrupt, counted, and are never loaded, on
// every path.
func TestMACRefusesPlanted(t *testing.T) {
	id := identity(1, 1)
	// The planter's values: the same blocks, saved with a CRC trailer
	// (verify "checksum", which needs no secret), and with another
	// tenant's secret.
	crcSrc := newMem(t)
	p := newRigLog(t, crcSrc, id, map[string]any{"lookup": "sync"}, connector.BlockMajor, nil)
	p.fill(0x33)
	p.saveAll(request("p", 4*bs+1))
	bsz := p.kv[0].BlockSize()
	crcVals := values(t, crcSrc, id, bsz+24)
	otherSrc := newMem(t)
	o := newRigLog(t, otherSrc, id, macExtra(otherKey), connector.BlockMajor, nil)
	o.fill(0x33)
	o.saveAll(request("o", 4*bs+1))
	otherVals := values(t, otherSrc, id, bsz+40)
	// The genuine values, for the value copied under another key.
	genSrc := newMem(t)
	g := newRigLog(t, genSrc, id, macExtra(tenantKey), connector.BlockMajor, nil)
	g.fill(0x33)
	g.saveAll(request("g", 4*bs+1))
	genuine := values(t, genSrc, id, bsz+40)

	planted := map[string]func(i int) []byte{
		"crc trailer": func(i int) []byte { return crcVals[i] },
		"crc trailer padded to the mac size": func(i int) []byte {
			return append(bytes.Clone(crcVals[i]), make([]byte, 16)...)
		},
		"mac format, made-up mac": func(i int) []byte {
			v := bytes.Clone(otherVals[i])
			rand.Read(v[bsz+8:])
			return v
		},
		"another secret's mac":         func(i int) []byte { return otherVals[i] },
		"genuine value of another key": func(i int) []byte { return genuine[(i+1)%4] },
	}
	for name, plant := range planted {
		for _, way := range []struct {
			name string
			wrap func(store.Store) store.Store
		}{{"staging", func(s store.Store) store.Store { return hidden{s} }}, {"vector", func(s store.Store) store.Store { return vectored{s} }}} {
			t.Run(name+"/"+way.name, func(t *testing.T) {
				st := newMem(t)
				var vals [][]byte
				for i := range 4 {
					vals = append(vals, plant(i))
				}
				putValues(t, st, id, vals)
				var logs logBuf
				b := newRigLog(t, way.wrap(st), id, macExtra(tenantKey), connector.BlockMajor, slog.New(slog.NewTextHandler(&logs, nil)))
				b.fill(0xee)
				loaded, fails := b.load("b")
				if loaded {
					t.Fatal("planted values were reported loaded")
				}
				if len(fails) != 1 || fails[0].Valid != 0 {
					t.Fatalf("failures = %+v, want one with 0 valid tokens", fails)
				}
				ws := b.ws[0].(connector.StatsReporter).Stats()
				if ws.Corrupt != 4 || ws.Loads != 0 {
					t.Errorf("Corrupt = %d, Loads = %d; want 4 and 0", ws.Corrupt, ws.Loads)
				}
				if strings.Contains(strings.ToLower(logs.String()), tenantKey) {
					t.Errorf("the log carries the secret:\n%s", logs.String())
				}
			})
		}
	}
}

// The contrast that shows the MAC is what refuses the planted values: a
// "checksum" reader loads the planter's CRC values as its own.
func TestChecksumTakesPlanted(t *testing.T) {
	id := identity(1, 1)
	src := newMem(t)
	p := newRigLog(t, src, id, map[string]any{"lookup": "sync"}, connector.BlockMajor, nil)
	p.fill(0x33)
	p.saveAll(request("p", 4*bs+1))
	st := newMem(t)
	putValues(t, st, id, values(t, src, id, p.kv[0].BlockSize()+24))
	b := newRigLog(t, st, id, map[string]any{"lookup": "sync"}, connector.BlockMajor, nil)
	if loaded, fails := b.load("b"); !loaded || len(fails) > 0 {
		t.Fatalf("checksum load of planted CRC values: loaded %v, failures %+v; want loaded", loaded, fails)
	}
}

// The secret comes from verify_key, else the environment; it is needed
// by "mac" and refused with the other modes; it never shows in an error
// or in a printed config.
func TestMACKey(t *testing.T) {
	open := func(extra map[string]any) error {
		cfg := connector.Config{Connector: storeconn.Name, Extra: extra}
		w, err := connector.OpenWorker(cfg, connector.Env{Identity: identity(1, 1), Store: newMem(t)})
		if err == nil {
			return w.Close()
		}
		return err
	}
	for _, tt := range []struct {
		name  string
		extra map[string]any
		env   string // "": unset
		want  string // "" for no error, else a part of the error
	}{
		{"config key", macExtra(tenantKey), "", ""},
		{"environment key", map[string]any{"verify": "mac"}, otherKey, ""},
		{"config key wins over a bad environment", macExtra(tenantKey), "zz", ""},
		{"no key", map[string]any{"verify": "mac"}, "", "needs the tenant's secret"},
		{"short key", macExtra(tenantKey[:62]), "", "verify_key holds 62 characters"},
		{"not hex", macExtra("zz" + tenantKey[2:]), "", "verify_key is not 64 hex digits"},
		{"not a string", map[string]any{"verify": "mac", "verify_key": 12345}, "", "verify_key is a int"},
		{"bad environment", map[string]any{"verify": "mac"}, tenantKey[:10], "KVCONNECT_VERIFY_KEY holds 10 characters"},
		{"key without mac", map[string]any{"verify": "checksum", "verify_key": tenantKey}, "", `verify is not "mac"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != "" {
				t.Setenv(storeconn.VerifyKeyEnv, tt.env)
			} else {
				unsetenv(t, storeconn.VerifyKeyEnv)
			}
			err := open(tt.extra)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("open = %v, want nil", err)
			case tt.want != "" && (!errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("open = %v, want ErrConfig saying %q", err, tt.want)
			}
			if err != nil {
				for _, k := range []string{tenantKey, tenantKey[:10], tenantKey[2:]} {
					if strings.Contains(err.Error(), k) {
						t.Errorf("the error carries the key's text: %v", err)
					}
				}
			}
		})
	}
	cfg := connector.Config{Connector: storeconn.Name, Extra: macExtra(tenantKey)}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		if s := fmt.Sprintf(verb, cfg); strings.Contains(s, tenantKey) {
			t.Errorf("Sprintf(%q, cfg) carries the secret: %s", verb, s)
		}
		if s := fmt.Sprintf(verb, &cfg); strings.Contains(s, tenantKey) {
			t.Errorf("Sprintf(%q, &cfg) carries the secret: %s", verb, s)
		}
	}
}

// A random secret in hex: what an operator makes with
// `openssl rand -hex 32`.
func TestMACKeyRandom(t *testing.T) {
	var k [32]byte
	rand.Read(k[:])
	key := hex.EncodeToString(k[:])
	st := newMem(t)
	a := newRigLog(t, st, identity(1, 1), macExtra(key), connector.BlockMajor, nil)
	a.fill(1)
	a.saveAll(request("a", 4*bs+1))
	b := newRigLog(t, st, identity(1, 1), macExtra(strings.ToUpper(key)), connector.BlockMajor, nil)
	if loaded, fails := b.load("b"); !loaded || len(fails) > 0 {
		t.Fatalf("load with the same secret in upper case: loaded %v, failures %+v", loaded, fails)
	}
}

// unsetenv unsets key for the test, restoring it after.
func unsetenv(t *testing.T, key string) {
	t.Helper()
	t.Setenv(key, "") // records the old value for restoring
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
}
