package mooncake

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// Environment variables the package reads.
const (
	// EnvLibrary names libtransfer_engine.so, or a folder holding it.
	EnvLibrary = "MOONCAKE_TRANSFER_ENGINE_LIBRARY"
	// The variables of ConfigFromEnv, which Mooncake's Python clients also
	// read.
	EnvLocalHostname = "MOONCAKE_LOCAL_HOSTNAME"
	EnvMetadata      = "MOONCAKE_TE_META_DATA_SERVER"
	EnvProtocol      = "MOONCAKE_PROTOCOL"
	EnvDevice        = "MOONCAKE_DEVICE"
)

// libraryName is the file the loader looks for.
const libraryName = "libtransfer_engine.so"

// P2PHandshake is the metadata setting with no metadata service: peers
// exchange segment descriptions directly, each engine listens on a port it
// picks, and its segment name is "host:port".
const P2PHandshake = "P2PHANDSHAKE"

// Config says how to start a Transfer Engine.
type Config struct {
	// Library is the path of the shared library; "" means the file or
	// folder MOONCAKE_TRANSFER_ENGINE_LIBRARY names, else
	// libtransfer_engine.so on the loader's path.
	Library string

	// Hostname is this engine's address as its peers reach it: an IP
	// address or a host name, without a port. Required.
	Hostname string

	// Metadata is P2PHandshake (the default), or the address of a metadata
	// service ("etcd://host:2379", "http://host:8080/metadata"), with
	// which the segment name is Hostname.
	Metadata string

	// Protocol is "tcp" (the default: no special hardware) or "rdma".
	Protocol string

	// Devices are the RDMA NICs to use (for example "mlx5_0"), for every
	// location; or NICPriorityMatrix is Mooncake's JSON NIC priority matrix
	// itself. One of them is required with rdma (unless AutoDiscover),
	// neither is allowed with tcp.
	Devices           []string
	NICPriorityMatrix string

	// AutoDiscover lets Mooncake discover the topology and install its
	// transports itself (RDMA where it finds NICs, else TCP); Protocol,
	// Devices and NICPriorityMatrix are then unused.
	AutoDiscover bool

	// HostLocation is the location registered with host memory, "cpu:0" by
	// default; "*" lets Mooncake find each page's NUMA node.
	HostLocation string

	// DeviceMemory allows registering device memory (as "cuda:N"), which
	// needs a library built with GPU support and a transport that reaches
	// it (RDMA with GPUDirect). Without it, device regions are refused.
	DeviceMemory bool

	// CloseTimeout bounds how long Close waits for transfers in flight
	// before giving up on them; 0 means 30 s.
	CloseTimeout time.Duration
}

// ConfigFromEnv returns a Config from MOONCAKE_LOCAL_HOSTNAME (required),
// MOONCAKE_TE_META_DATA_SERVER, MOONCAKE_PROTOCOL and MOONCAKE_DEVICE
// (comma-separated NIC names), with defaults for the rest.
func ConfigFromEnv() (Config, error) {
	c := Config{
		Hostname: os.Getenv(EnvLocalHostname),
		Metadata: os.Getenv(EnvMetadata),
		Protocol: os.Getenv(EnvProtocol),
	}
	if d := os.Getenv(EnvDevice); d != "" {
		c.Devices = strings.Split(d, ",")
	}
	if c.Hostname == "" {
		return Config{}, fmt.Errorf("mooncake: %s is not set", EnvLocalHostname)
	}
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// EnsureDefaults fills unset fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Metadata == "" {
		c.Metadata = P2PHandshake
	}
	if c.Protocol == "" {
		c.Protocol = "tcp"
	}
	c.Protocol = strings.ToLower(c.Protocol)
	if c.HostLocation == "" {
		c.HostLocation = "cpu:0"
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 30 * time.Second
	}
}

// Validate reports the first field that is missing or out of range, with
// its value. It expects defaults to be filled.
func (c Config) Validate() error {
	switch {
	case c.Hostname == "":
		return fmt.Errorf("mooncake: Config.Hostname is empty: set this engine's address as peers reach it")
	case strings.ContainsAny(c.Hostname, " \t\n/\x00") || strings.Count(c.Hostname, ":") == 1:
		return fmt.Errorf("mooncake: Config.Hostname = %q: want an IP address or host name without a port", c.Hostname)
	case c.Metadata == "":
		return fmt.Errorf("mooncake: Config.Metadata is empty")
	case strings.ContainsRune(c.Metadata, 0):
		return fmt.Errorf("mooncake: Config.Metadata = %q: contains a NUL byte", c.Metadata)
	case c.CloseTimeout < 0:
		return fmt.Errorf("mooncake: Config.CloseTimeout = %v, want >= 0", c.CloseTimeout)
	case c.HostLocation == "" || strings.ContainsRune(c.HostLocation, 0):
		return fmt.Errorf("mooncake: Config.HostLocation = %q", c.HostLocation)
	}
	if c.AutoDiscover {
		return nil
	}
	switch c.Protocol {
	case "tcp":
		if len(c.Devices) > 0 || c.NICPriorityMatrix != "" {
			return fmt.Errorf("mooncake: Config.Devices = %q / NICPriorityMatrix set with protocol tcp: NICs are for rdma", c.Devices)
		}
	case "rdma":
		if len(c.Devices) == 0 && c.NICPriorityMatrix == "" {
			return fmt.Errorf("mooncake: Config.Protocol = rdma needs Devices (NIC names such as mlx5_0), NICPriorityMatrix or AutoDiscover")
		}
		if len(c.Devices) > 0 && c.NICPriorityMatrix != "" {
			return fmt.Errorf("mooncake: Config.Devices and Config.NICPriorityMatrix are both set: set one")
		}
		for i, d := range c.Devices {
			if d == "" || strings.ContainsAny(d, "\",\\ \t\n") || strings.ContainsRune(d, 0) {
				return fmt.Errorf("mooncake: Config.Devices[%d] = %q: want a NIC name such as mlx5_0", i, d)
			}
		}
		if c.NICPriorityMatrix != "" && !json.Valid([]byte(c.NICPriorityMatrix)) {
			return fmt.Errorf("mooncake: Config.NICPriorityMatrix is not valid JSON: %.60q", c.NICPriorityMatrix)
		}
	default:
		return fmt.Errorf("mooncake: Config.Protocol = %q, want tcp or rdma", c.Protocol)
	}
	return nil
}

// matrix returns the NIC priority matrix installTransport receives for
// rdma: NICPriorityMatrix, or one built from Devices that gives every
// location (host NUMA nodes 0-7 and devices 0-15) the same NICs.
func (c Config) matrix() string {
	if c.NICPriorityMatrix != "" {
		return c.NICPriorityMatrix
	}
	names, err := json.Marshal(c.Devices)
	if err != nil {
		panic(err) // strings always marshal
	}
	var b strings.Builder
	b.WriteByte('{')
	add := func(loc string) {
		if b.Len() > 1 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q: [%s, []]", loc, names)
	}
	for i := range 8 {
		add(fmt.Sprintf("cpu:%d", i))
	}
	for i := range 16 {
		add(fmt.Sprintf("cuda:%d", i))
	}
	b.WriteByte('}')
	return b.String()
}
