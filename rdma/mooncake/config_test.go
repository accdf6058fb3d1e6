package mooncake

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestConfigDefaults(t *testing.T) {
	c := Config{Hostname: "10.0.0.1", Protocol: "TCP"}
	c.EnsureDefaults()
	want := Config{Hostname: "10.0.0.1", Metadata: P2PHandshake, Protocol: "tcp", HostLocation: "cpu:0", CloseTimeout: 30 * time.Second}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("EnsureDefaults (-want +got):\n%s", diff)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate(defaults) = %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // substring of the error; "" for valid
	}{
		{"valid tcp", func(c *Config) {}, ""},
		{"valid rdma", func(c *Config) { c.Protocol = "rdma"; c.Devices = []string{"mlx5_0"} }, ""},
		{"valid matrix", func(c *Config) { c.Protocol = "rdma"; c.NICPriorityMatrix = `{"cpu:0": [["mlx5_0"], []]}` }, ""},
		{"valid auto", func(c *Config) { c.Protocol = "whatever"; c.AutoDiscover = true }, ""},
		{"valid ipv6", func(c *Config) { c.Hostname = "fe80::1" }, ""},
		{"no hostname", func(c *Config) { c.Hostname = "" }, "Config.Hostname is empty"},
		{"hostname with port", func(c *Config) { c.Hostname = "10.0.0.1:1234" }, `Config.Hostname = "10.0.0.1:1234"`},
		{"unknown protocol", func(c *Config) { c.Protocol = "udp" }, `Config.Protocol = "udp"`},
		{"rdma without devices", func(c *Config) { c.Protocol = "rdma" }, "needs Devices"},
		{"devices with tcp", func(c *Config) { c.Devices = []string{"mlx5_0"} }, "NICs are for rdma"},
		{"both", func(c *Config) { c.Protocol = "rdma"; c.Devices = []string{"a"}; c.NICPriorityMatrix = "{}" }, "both set"},
		{"bad device", func(c *Config) { c.Protocol = "rdma"; c.Devices = []string{"mlx5_0", `x"y`} }, "Config.Devices[1]"},
		{"bad matrix", func(c *Config) { c.Protocol = "rdma"; c.NICPriorityMatrix = "{" }, "not valid JSON"},
		{"negative timeout", func(c *Config) { c.CloseTimeout = -time.Second }, "Config.CloseTimeout = -1s"},
		{"NUL in hostname", func(c *Config) { c.Hostname = "10.0.0.1\x00evil" }, "Config.Hostname"},
		{"NUL in metadata", func(c *Config) { c.Metadata = "P2PHANDSHAKE\x00" }, "Config.Metadata"},
	} {
		c := Config{Hostname: "10.0.0.1"}
		tc.edit(&c)
		c.EnsureDefaults()
		err := c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: Validate = %v, want nil", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Validate = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestConfigMatrix(t *testing.T) {
	c := Config{Devices: []string{"mlx5_0", "mlx5_3"}}
	var m map[string][2][]string
	if err := json.Unmarshal([]byte(c.matrix()), &m); err != nil {
		t.Fatalf("matrix() is not JSON: %v\n%s", err, c.matrix())
	}
	if len(m) != 24 {
		t.Errorf("matrix has %d locations, want 24 (cpu:0-7, cuda:0-15)", len(m))
	}
	if diff := cmp.Diff([2][]string{{"mlx5_0", "mlx5_3"}, {}}, m["cuda:15"]); diff != "" {
		t.Errorf(`matrix["cuda:15"] (-want +got):\n%s`, diff)
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv(EnvLocalHostname, "")
	if _, err := ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), EnvLocalHostname) {
		t.Errorf("ConfigFromEnv without %s = %v, want an error naming it", EnvLocalHostname, err)
	}
	t.Setenv(EnvLocalHostname, "10.1.2.3")
	t.Setenv(EnvMetadata, "")
	t.Setenv(EnvProtocol, "rdma")
	t.Setenv(EnvDevice, "mlx5_0,mlx5_1")
	c, err := ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Hostname: "10.1.2.3", Metadata: P2PHandshake, Protocol: "rdma", Devices: []string{"mlx5_0", "mlx5_1"}, HostLocation: "cpu:0", CloseTimeout: 30 * time.Second}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("ConfigFromEnv (-want +got):\n%s", diff)
	}
}
