package connector_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/connector"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    connector.Config
		wantErr string // substring; "" for success
	}{
		{
			name: "defaults",
			in:   `{"kv_connector": "StoreConnector"}`,
			want: connector.Config{Connector: "StoreConnector", Role: connector.RoleBoth, LoadFailurePolicy: connector.PolicyRecompute},
		},
		{
			name: "vllm style",
			in: `{"kv_connector": "StoreConnector", "kv_role": "kv_consumer", "kv_load_failure_policy": "fail",
			      "engine_id": "e1", "kv_connector_extra_config": {"lookup": "sync"}}`,
			want: connector.Config{
				Connector: "StoreConnector", Role: connector.RoleConsumer, LoadFailurePolicy: connector.PolicyFail,
				EngineID: "e1", Extra: map[string]any{"lookup": "sync"},
			},
		},
		{name: "empty connector", in: `{"kv_role": "kv_both"}`, wantErr: "kv_connector is empty"},
		{name: "bad role", in: `{"kv_connector": "x", "kv_role": "kv_everything"}`, wantErr: `kv_role = "kv_everything"`},
		{name: "bad policy", in: `{"kv_connector": "x", "kv_load_failure_policy": "retry"}`, wantErr: `kv_load_failure_policy = "retry"`},
		{name: "misspelt field", in: `{"kv_connector": "x", "kv_rolle": "kv_both"}`, wantErr: `"kv_rolle"`},
		{name: "wrong type", in: `{"kv_connector": 7}`, wantErr: `field "kv_connector"`},
		{name: "not json", in: `kv_connector=x`, wantErr: "invalid character"},
		{name: "trailing", in: `{"kv_connector": "x"} {}`, wantErr: "trailing data"},
		{name: "negative rank", in: `{"kv_connector": "x", "kv_rank": -1}`, wantErr: "kv_rank = -1"},
		{name: "rank past size", in: `{"kv_connector": "x", "kv_rank": 2, "kv_parallel_size": 2}`, wantErr: "kv_rank = 2, want < kv_parallel_size (2)"},
		{name: "zero parallel size", in: `{"kv_connector": "x", "kv_parallel_size": 0}`, wantErr: "kv_parallel_size = 0"},
		{name: "port out of range", in: `{"kv_connector": "x", "kv_port": 70000}`, wantErr: "kv_port = 70000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := connector.ParseConfig([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, connector.ErrConfig) {
					t.Fatalf("ParseConfig(%s) error = %v, want ErrConfig containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseConfig(%s): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseConfig(%s) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestExtraAccessors(t *testing.T) {
	cfg, err := connector.ParseConfig([]byte(`{"kv_connector": "x", "kv_connector_extra_config": {
		"n": 12, "ns": "7", "b": true, "bs": "false", "d": "250ms", "dn": 1.5, "s": "hi", "bad": [1], "huge": 1e12}}`))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := cfg.ExtraInt("n", 0); v != 12 || err != nil {
		t.Errorf("ExtraInt(n) = %d, %v, want 12", v, err)
	}
	if v, err := cfg.ExtraInt("ns", 0); v != 7 || err != nil {
		t.Errorf("ExtraInt(ns) = %d, %v, want 7", v, err)
	}
	if v, err := cfg.ExtraInt("absent", 3); v != 3 || err != nil {
		t.Errorf("ExtraInt(absent) = %d, %v, want default 3", v, err)
	}
	if v, err := cfg.ExtraBool("b", false); !v || err != nil {
		t.Errorf("ExtraBool(b) = %v, %v, want true", v, err)
	}
	if v, err := cfg.ExtraBool("bs", true); v || err != nil {
		t.Errorf("ExtraBool(bs) = %v, %v, want false", v, err)
	}
	if v, err := cfg.ExtraDuration("d", 0); v != 250*time.Millisecond || err != nil {
		t.Errorf("ExtraDuration(d) = %v, %v, want 250ms", v, err)
	}
	if v, err := cfg.ExtraDuration("dn", 0); v != 1500*time.Millisecond || err != nil {
		t.Errorf("ExtraDuration(dn) = %v, %v, want 1.5s", v, err)
	}
	if v, err := cfg.ExtraString("s", ""); v != "hi" || err != nil {
		t.Errorf("ExtraString(s) = %q, %v, want hi", v, err)
	}
	for name, call := range map[string]func() error{
		"int":           func() error { _, err := cfg.ExtraInt("bad", 0); return err },
		"bool":          func() error { _, err := cfg.ExtraBool("n", false); return err },
		"duration":      func() error { _, err := cfg.ExtraDuration("s", 0); return err },
		"string":        func() error { _, err := cfg.ExtraString("n", ""); return err },
		"huge duration": func() error { _, err := cfg.ExtraDuration("huge", 0); return err },
	} {
		err := call()
		if err == nil || !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), "kv_connector_extra_config.") {
			t.Errorf("%s accessor on a wrong type: error = %v, want ErrConfig naming the key", name, err)
		}
	}
}

type nopDriver struct{}

func (nopDriver) OpenPlanner(connector.Config, connector.Env) (connector.Planner, error) {
	return nil, errors.New("nop")
}
func (nopDriver) OpenWorker(connector.Config, connector.Env) (connector.Worker, error) {
	return nil, errors.New("nop")
}

// registryRuns names TestRegistry's drivers apart across -count runs: the
// registry lives as long as the process.
var registryRuns int

func TestRegistry(t *testing.T) {
	registryRuns++
	a, b := fmt.Sprintf("registry-test-%d-a", registryRuns), fmt.Sprintf("registry-test-%d-b", registryRuns)
	connector.Register(b, nopDriver{})
	connector.Register(a, nopDriver{})
	names := connector.Drivers()
	ia, ib := -1, -1
	for i, n := range names {
		switch n {
		case a:
			ia = i
		case b:
			ib = i
		}
	}
	if ia < 0 || ib < 0 || ia > ib {
		t.Errorf("Drivers() = %v, want both test drivers, sorted", names)
	}
	mustPanic(t, "duplicate", func() { connector.Register(a, nopDriver{}) })
	mustPanic(t, "nil", func() { connector.Register("registry-test-nil", nil) })

	_, err := connector.OpenPlanner(connector.Config{Connector: "nosuch"}, connector.Env{})
	if err == nil || err.Error() != `connector: unknown connector "nosuch" (forgotten import?)` {
		t.Errorf("OpenPlanner(nosuch) error = %v", err)
	}
	_, err = connector.OpenWorker(connector.Config{Connector: "nosuch"}, connector.Env{})
	if err == nil || !strings.Contains(err.Error(), "forgotten import?") {
		t.Errorf("OpenWorker(nosuch) error = %v", err)
	}
	_, err = connector.OpenWorker(connector.Config{Connector: a, Role: "bad"}, connector.Env{})
	if !errors.Is(err, connector.ErrConfig) {
		t.Errorf("OpenWorker with a bad role: error = %v, want ErrConfig", err)
	}
	_, err = connector.OpenPlanner(connector.Config{Connector: a}, connector.Env{})
	if err == nil || err.Error() != "nop" {
		t.Errorf("OpenPlanner(%s) error = %v, want the driver's", a, err)
	}
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", what)
		}
	}()
	f()
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"kv_connector": "StoreConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"lookup": "sync"}}`))
	f.Add([]byte(`{"kv_connector": "x", "kv_load_failure_policy": "fail", "kv_rank": 1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := connector.ParseConfig(data)
		if err != nil {
			if !errors.Is(err, connector.ErrConfig) {
				t.Fatalf("ParseConfig error %v does not wrap ErrConfig", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("ParseConfig accepted a config that Validate rejects: %v", err)
		}
		for k := range c.Extra {
			// Accessors never panic, whatever the JSON held.
			c.ExtraInt(k, 0)
			c.ExtraBool(k, false)
			c.ExtraString(k, "")
			c.ExtraDuration(k, 0)
		}
	})
}

func TestCheckExtra(t *testing.T) {
	c := connector.Config{Connector: "C", Extra: map[string]any{"lookup": "sync", "transfer_workres": 2}}
	err := c.CheckExtra("lookup", "transfer_workers")
	if !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), `transfer_workres is not a key of C (did you mean "transfer_workers"?)`) {
		t.Errorf("CheckExtra = %v, want ErrConfig naming the key and the suggestion", err)
	}
	c.Extra = map[string]any{"zzz": 1, "aaa": 1}
	err = c.CheckExtra("lookup", "transfer_workers")
	if err == nil || !strings.Contains(err.Error(), "aaa is not a key of C; its keys are lookup, transfer_workers") {
		t.Errorf("CheckExtra = %v, want the first unknown key in order and the known keys", err)
	}
	c.Extra = map[string]any{"lookup": 1}
	if err := c.CheckExtra("lookup"); err != nil {
		t.Errorf("CheckExtra of known keys = %v", err)
	}
}

func TestExtraChoice(t *testing.T) {
	c := connector.Config{Connector: "C", Extra: map[string]any{"mode": "fast", "n": 3}}
	if v, err := c.ExtraChoice("mode", "slow", "slow", "fast"); err != nil || v != "fast" {
		t.Errorf("ExtraChoice(mode) = %q, %v; want fast", v, err)
	}
	if v, err := c.ExtraChoice("absent", "slow", "slow", "fast"); err != nil || v != "slow" {
		t.Errorf("ExtraChoice(absent) = %q, %v; want the default", v, err)
	}
	if _, err := c.ExtraChoice("mode", "slow", "slow", "careful"); !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), `mode = "fast", want slow or careful`) {
		t.Errorf("ExtraChoice of a value not among the choices = %v", err)
	}
	if _, err := c.ExtraChoice("n", "a", "a"); !errors.Is(err, connector.ErrConfig) {
		t.Errorf("ExtraChoice of a number = %v, want ErrConfig", err)
	}
}
