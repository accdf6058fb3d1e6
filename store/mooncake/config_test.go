package mooncake

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/kvconnect/kvconnect/store"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Size
	}{
		{"0", 0},
		{"1073741824", 1 << 30},
		{"4GB", 4 << 30},
		{"4gb", 4 << 30},
		{" 4 GB ", 4 << 30},
		{"4G", 4 << 30},
		{"512MB", 512 << 20},
		{"512m", 512 << 20},
		{"16KB", 16 << 10},
		{"1TB", 1 << 40},
		{"1.5GB", 3 << 29},
		{"3355443200", 3355443200},
		{"100b", 100},
		{"1e3", 1000},
		{"0.5k", 512},
	} {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "4QB", "GB", "-1", "-1GB", "four", "4 G B", "NaN", "inf", "1e30", "2000TB", "0x10", "4GiB"} {
		if got, err := ParseSize(in); err == nil || !strings.Contains(err.Error(), "invalid size") {
			t.Errorf("ParseSize(%q) = %d, %v; want an invalid size error", in, got, err)
		}
	}
}

func TestSizeString(t *testing.T) {
	for _, tc := range []struct {
		in   Size
		want string
	}{{0, "0"}, {4 << 30, "4GB"}, {1536 << 20, "1536MB"}, {1000, "1000"}, {3355443200, "3200MB"}} {
		if got := tc.in.String(); got != tc.want {
			t.Errorf("Size(%d).String() = %q, want %q", uint64(tc.in), got, tc.want)
		}
		if back, err := ParseSize(tc.in.String()); err != nil || back != tc.in {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in.String(), back, err, uint64(tc.in))
		}
	}
}

// vllmConfig is the shape of the file vLLM's and LMDeploy's Mooncake
// integrations read from MOONCAKE_CONFIG_PATH.
const vllmConfig = `{
    "local_hostname": "node1",
    "metadata_server": "P2PHANDSHAKE",
    "global_segment_size": "4GB",
    "local_buffer_size": 1073741824,
    "protocol": "RDMA",
    "device_name": "mlx5_0,mlx5_1",
    "master_server_address": "10.0.0.1:50051",
    "enable_ssd_offload": false,
    "ssd_offload_path": "",
    "tenant_id": "default",
    "mode": "embedded",
    "enable_client_http_server": false,
    "client_http_port": 9300,
    "some_future_field": {"x": 1}
}`

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want Config
	}{
		{"vllm", vllmConfig, Config{
			LocalHostname: "node1", MetadataServer: "P2PHANDSHAKE", MasterServerAddress: "10.0.0.1:50051",
			GlobalSegmentSize: 4 << 30, LocalBufferSize: 1 << 30, Protocol: "rdma", DeviceName: "mlx5_0,mlx5_1",
			TenantID: "default", RemoveLeaseWait: DefaultRemoveLeaseWait, LeaseTTL: DefaultLeaseTTL,
		}},
		{"minimal", `{"local_hostname": "h", "metadata_server": "", "master_server_address": "m:1"}`, Config{
			LocalHostname: "h", MetadataServer: "P2PHANDSHAKE", MasterServerAddress: "m:1",
			GlobalSegmentSize: DefaultGlobalSegmentSize, LocalBufferSize: DefaultLocalBufferSize, Protocol: "tcp",
			RemoveLeaseWait: DefaultRemoveLeaseWait, LeaseTTL: DefaultLeaseTTL,
		}},
		{"nulls and zero sizes", `{"local_hostname": "h", "metadata_server": "http://m:8080/metadata", "master_server_address": "m:1",
			"device_name": null, "global_segment_size": 0, "local_buffer_size": "0", "protocol": null}`, Config{
			LocalHostname: "h", MetadataServer: "http://m:8080/metadata", MasterServerAddress: "m:1", Protocol: "tcp",
			RemoveLeaseWait: DefaultRemoveLeaseWait, LeaseTTL: DefaultLeaseTTL,
		}},
		{"replication", `{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1",
			"replica_num": 2, "preferred_segments": ["h:12300"], "global_segment_size": "512 mb"}`, Config{
			LocalHostname: "h", MetadataServer: "P2PHANDSHAKE", MasterServerAddress: "m:1", Protocol: "tcp",
			GlobalSegmentSize: 512 << 20, LocalBufferSize: DefaultLocalBufferSize,
			ReplicaNum: 2, PreferredSegments: []string{"h:12300"}, RemoveLeaseWait: DefaultRemoveLeaseWait, LeaseTTL: DefaultLeaseTTL,
		}},
		{"presence only", `{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1",
			"presence_only": true}`, Config{
			LocalHostname: "h", MetadataServer: "P2PHANDSHAKE", MasterServerAddress: "m:1", Protocol: "tcp",
			GlobalSegmentSize: DefaultGlobalSegmentSize, LocalBufferSize: DefaultLocalBufferSize, PresenceOnly: true,
			RemoveLeaseWait: DefaultRemoveLeaseWait, LeaseTTL: DefaultLeaseTTL,
		}},
		{"remove lease wait", `{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1",
			"remove_lease_wait": "250ms"}`, Config{
			LocalHostname: "h", MetadataServer: "P2PHANDSHAKE", MasterServerAddress: "m:1", Protocol: "tcp",
			GlobalSegmentSize: DefaultGlobalSegmentSize, LocalBufferSize: DefaultLocalBufferSize, RemoveLeaseWait: 250 * time.Millisecond, LeaseTTL: DefaultLeaseTTL,
		}},
		{"remove lease wait in seconds", `{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1",
			"remove_lease_wait": 12.5}`, Config{
			LocalHostname: "h", MetadataServer: "P2PHANDSHAKE", MasterServerAddress: "m:1", Protocol: "tcp",
			GlobalSegmentSize: DefaultGlobalSegmentSize, LocalBufferSize: DefaultLocalBufferSize, RemoveLeaseWait: 12500 * time.Millisecond, LeaseTTL: DefaultLeaseTTL,
		}},
		{"lease ttl in milliseconds", `{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1",
			"default_kv_lease_ttl": 5000}`, Config{
			LocalHostname: "h", MetadataServer: "P2PHANDSHAKE", MasterServerAddress: "m:1", Protocol: "tcp",
			GlobalSegmentSize: DefaultGlobalSegmentSize, LocalBufferSize: DefaultLocalBufferSize,
			RemoveLeaseWait: DefaultRemoveLeaseWait, LeaseTTL: 5 * time.Second,
		}},
		{"lease ttl as a duration", `{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1",
			"default_kv_lease_ttl": "500ms"}`, Config{
			LocalHostname: "h", MetadataServer: "P2PHANDSHAKE", MasterServerAddress: "m:1", Protocol: "tcp",
			GlobalSegmentSize: DefaultGlobalSegmentSize, LocalBufferSize: DefaultLocalBufferSize,
			RemoveLeaseWait: DefaultRemoveLeaseWait, LeaseTTL: 500 * time.Millisecond,
		}},
		{"no lease ttl", `{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1",
			"default_kv_lease_ttl": 0}`, Config{
			LocalHostname: "h", MetadataServer: "P2PHANDSHAKE", MasterServerAddress: "m:1", Protocol: "tcp",
			GlobalSegmentSize: DefaultGlobalSegmentSize, LocalBufferSize: DefaultLocalBufferSize,
			RemoveLeaseWait: DefaultRemoveLeaseWait, LeaseTTL: NoLeaseTTL,
		}},
		{"no remove retry", `{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1",
			"remove_lease_wait": 0}`, Config{
			LocalHostname: "h", MetadataServer: "P2PHANDSHAKE", MasterServerAddress: "m:1", Protocol: "tcp",
			GlobalSegmentSize: DefaultGlobalSegmentSize, LocalBufferSize: DefaultLocalBufferSize, RemoveLeaseWait: NoRemoveWait, LeaseTTL: DefaultLeaseTTL,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseConfig([]byte(tc.in))
			if err != nil {
				t.Fatalf("ParseConfig = %v", err)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(Config{}, "Logger")); diff != "" {
				t.Errorf("ParseConfig (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	base := func(extra string) string {
		return `{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1"` + extra + `}`
	}
	for _, tc := range []struct {
		name string
		in   string
		want []string // substrings of the error: the field and the value
	}{
		{"not JSON", `{"local_hostname": `, []string{"not a JSON object"}},
		{"array", `[1, 2]`, []string{"not a JSON object"}},
		{"null", `null`, []string{"not a JSON object"}},
		{"trailing data", base("") + `{}`, []string{"after the JSON object"}},
		{"missing master", `{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE"}`, []string{"master_server_address"}},
		{"missing hostname", `{"master_server_address": "m:1", "metadata_server": "P2PHANDSHAKE"}`, []string{"local_hostname"}},
		{"empty master", `{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": " "}`, []string{"master_server_address", "empty"}},
		{"bad size unit", base(`, "global_segment_size": "4QB"`), []string{"global_segment_size", `"4QB"`}},
		{"negative size", base(`, "local_buffer_size": -1`), []string{"local_buffer_size", "-1"}},
		{"fractional size", base(`, "local_buffer_size": 1.5`), []string{"local_buffer_size", "1.5"}},
		{"size as bool", base(`, "global_segment_size": true`), []string{"global_segment_size", "true"}},
		{"huge size", base(`, "global_segment_size": "9000TB"`), []string{"global_segment_size", "9000TB"}},
		{"segment below the minimum", base(`, "global_segment_size": "8MB"`), []string{"global_segment_size", "8388608 bytes", "minimum of 16777216"}},
		{"unknown protocol", base(`, "protocol": "carrier-pigeon"`), []string{"protocol", `"carrier-pigeon"`, "tcp"}},
		{"presence_only not a bool", base(`, "presence_only": "yes"`), []string{"presence_only", `"yes"`}},
		{"protocol as number", base(`, "protocol": 6`), []string{"protocol", "6"}},
		{"hostname with space", `{"local_hostname": "my host", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1"}`, []string{"local_hostname", `"my host"`}},
		{"tenant", base(`, "tenant_id": "acme"`), []string{"tenant_id", `"acme"`}},
		{"replicas", base(`, "replica_num": -2`), []string{"replica_num", "-2"}},
		{"replicas as string", base(`, "replica_num": "2"`), []string{"replica_num", `"2"`}},
		{"empty segment", base(`, "preferred_segments": ["a", ""]`), []string{"preferred_segments", "entry 1"}},
		{"device NUL", base(`, "device_name": "mlx\u0000"`), []string{"device_name"}},
		{"negative wait", base(`, "remove_lease_wait": "-1s"`), []string{"remove_lease_wait", `"-1s"`}},
		{"negative wait in seconds", base(`, "remove_lease_wait": -3`), []string{"remove_lease_wait", "-3"}},
		{"wait too long", base(`, "remove_lease_wait": 86400`), []string{"remove_lease_wait", "86400"}},
		{"wait not a duration", base(`, "remove_lease_wait": "soon"`), []string{"remove_lease_wait", `"soon"`}},
		{"wait as bool", base(`, "remove_lease_wait": true`), []string{"remove_lease_wait", "true"}},
		{"negative ttl", base(`, "default_kv_lease_ttl": -1`), []string{"default_kv_lease_ttl", "-1"}},
		{"fractional ttl", base(`, "default_kv_lease_ttl": 2.5`), []string{"default_kv_lease_ttl", "2.5", "milliseconds"}},
		{"ttl too long", base(`, "default_kv_lease_ttl": "48h"`), []string{"default_kv_lease_ttl", `"48h"`}},
		{"ttl without unit", base(`, "default_kv_lease_ttl": "5000"`), []string{"default_kv_lease_ttl", `"5000"`}},
		{"ttl as bool", base(`, "default_kv_lease_ttl": false`), []string{"default_kv_lease_ttl", "false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseConfig([]byte(tc.in))
			if err == nil {
				t.Fatalf("ParseConfig(%s) = %+v, want an error", tc.in, got)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("ParseConfig(%s) = %v, want it to mention %s", tc.in, err, w)
				}
			}
		})
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mooncake.json")
	if err := os.WriteFile(path, []byte(vllmConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil || cfg.MasterServerAddress != "10.0.0.1:50051" {
		t.Errorf("LoadConfig = %+v, %v", cfg, err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "absent.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadConfig(absent) = %v, want os.ErrNotExist", err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"local_hostname": "h", "metadata_server": "x", "master_server_address": "m:1", "protocol": "smoke"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "smoke") {
		t.Errorf("LoadConfig(bad) = %v, want an error naming the file and the value", err)
	}
}

func TestConfigFromEnv(t *testing.T) {
	for _, v := range []string{EnvConfigPath, EnvMaster, envHostname, envMetadata, envSegment, envBuffer, envProtocol, envDevice, envTenant} {
		t.Setenv(v, "")
	}
	if _, err := ConfigFromEnv(); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ConfigFromEnv() with nothing set = %v, want store.ErrUnavailable", err)
	}

	t.Setenv(EnvMaster, "10.0.0.2:50051")
	t.Setenv(envSegment, "1GB")
	t.Setenv(envProtocol, "TCP")
	cfg, err := ConfigFromEnv()
	want := Config{
		LocalHostname: "localhost", MetadataServer: "P2PHANDSHAKE", MasterServerAddress: "10.0.0.2:50051",
		GlobalSegmentSize: 1 << 30, LocalBufferSize: DefaultLocalBufferSize, Protocol: "tcp",
		RemoveLeaseWait: DefaultRemoveLeaseWait, LeaseTTL: DefaultLeaseTTL,
	}
	if diff := cmp.Diff(want, cfg); err != nil || diff != "" {
		t.Errorf("ConfigFromEnv() = %v, (-want +got):\n%s", err, diff)
	}

	t.Setenv(envBuffer, "lots")
	if _, err := ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), envBuffer) || !strings.Contains(err.Error(), "lots") {
		t.Errorf("ConfigFromEnv() with %s=lots = %v, want an error naming both", envBuffer, err)
	}

	path := filepath.Join(t.TempDir(), "m.json")
	if err := os.WriteFile(path, []byte(vllmConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvConfigPath, path)
	if cfg, err := ConfigFromEnv(); err != nil || cfg.LocalHostname != "node1" {
		t.Errorf("ConfigFromEnv() with %s = %+v, %v; want the file's config", EnvConfigPath, cfg, err)
	}
}

func TestValidateGoConfig(t *testing.T) {
	cfg := Config{MasterServerAddress: "m:1"}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate(defaults + master) = %v", err)
	}
	cfg.GlobalSegmentSize = maxSize + 1
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "global_segment_size") {
		t.Errorf("Validate(huge segment) = %v", err)
	}
	for _, tc := range []struct{ in, want time.Duration }{
		{0, DefaultRemoveLeaseWait},
		{-time.Second, NoRemoveWait},
		{NoRemoveWait, NoRemoveWait},
		{time.Minute, time.Minute},
	} {
		c := Config{MasterServerAddress: "m:1", RemoveLeaseWait: tc.in}
		c.EnsureDefaults()
		if c.RemoveLeaseWait != tc.want {
			t.Errorf("EnsureDefaults(RemoveLeaseWait %v) = %v, want %v", tc.in, c.RemoveLeaseWait, tc.want)
		}
	}
	for _, tc := range []struct{ in, want time.Duration }{
		{0, DefaultLeaseTTL},
		{-time.Second, NoLeaseTTL},
		{NoLeaseTTL, NoLeaseTTL},
		{time.Minute, time.Minute},
	} {
		c := Config{MasterServerAddress: "m:1", LeaseTTL: tc.in}
		c.EnsureDefaults()
		if c.LeaseTTL != tc.want {
			t.Errorf("EnsureDefaults(LeaseTTL %v) = %v, want %v", tc.in, c.LeaseTTL, tc.want)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"4GB", "1.5 mb", "0", "4QB", "1e3", "-1k", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			if n != 0 {
				t.Errorf("ParseSize(%q) = %d with error %v", s, n, err)
			}
			return
		}
		if n > maxSize {
			t.Errorf("ParseSize(%q) = %d > max", s, n)
		}
		if back, err := ParseSize(n.String()); err != nil || back != n {
			t.Errorf("ParseSize(%q) = %d, but ParseSize(%q) = %d, %v", s, n, n.String(), back, err)
		}
	})
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(vllmConfig))
	f.Add([]byte(`{"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_address": "m:1", "global_segment_size": "1GB"}`))
	f.Add([]byte(`{"local_hostname": 1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("ParseConfig(%q) returned a config that fails Validate: %v", data, err)
		}
	})
}

// TestSetupHint: the "is the master up" hint is given only for codes an
// unreachable master produces; a refused parameter says so instead.
func TestSetupHint(t *testing.T) {
	for _, tt := range []struct {
		code int
		want string
	}{
		{CodeInternal, "is the master up"},
		{CodeRPCTimeout, "is the master up"},
		{CodeInvalidParams, "refused a parameter: global_segment_size"},
		{CodeNoAvailableHandle, ""},
	} {
		got := setupHint(Error{Op: opSetup, Code: tt.code})
		if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
			t.Errorf("setupHint(%d) = %q, want %q", tt.code, got, tt.want)
		}
	}
}
