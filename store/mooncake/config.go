package mooncake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvconnect/kvconnect/store"
)

// Defaults Mooncake's own configuration loaders apply to absent sizes.
const (
	DefaultGlobalSegmentSize Size = 3355443200 // 3.125 GiB
	// MinGlobalSegmentSize is the smallest segment Mooncake's setup takes:
	// below it setup fails with INVALID_PARAMS (16 MiB at the commit
	// bound). Zero, no segment at all, is accepted.
	MinGlobalSegmentSize   Size = 16 << 20
	DefaultLocalBufferSize Size = 1073741824 // 1 GiB
	DefaultMetadataServer       = "P2PHANDSHAKE"
	DefaultProtocol             = "tcp"
	DefaultLocalHostname        = "localhost"

	// DefaultRemoveLeaseWait is how long Remove waits by default for the
	// read lease on a key to end: far longer than a transfer in flight
	// takes, far shorter than a lease granted by an exists or a get lasts
	// (the master's --default_kv_lease_ttl, 10 s by default).
	DefaultRemoveLeaseWait = time.Second
	// NoRemoveWait, as Config.RemoveLeaseWait, makes Remove fail at once
	// when the key is under a read lease.
	NoRemoveWait time.Duration = -1

	// DefaultLeaseTTL is the read lease a mooncake_master grants by
	// default (its --default_kv_lease_ttl) at the Mooncake commit this
	// binding follows, 3b5a5941: 10 s, as measured there. Other Mooncake
	// versions default to 5 s.
	DefaultLeaseTTL = 10 * time.Second
	// NoLeaseTTL, as Config.LeaseTTL, declares a master whose leases end
	// with the call that granted them (--default_kv_lease_ttl=0): a key is
	// held only while a get copies it.
	NoLeaseTTL time.Duration = -1
)

// Environment variables read by [ConfigFromEnv] and [Open].
const (
	EnvConfigPath = "MOONCAKE_CONFIG_PATH"    // path of a JSON config file
	EnvMaster     = "MOONCAKE_MASTER"         // master address, when there is no config file
	EnvLibrary    = "MOONCAKE_STORE_LIBRARY"  // path of libmooncake_store.so
	libraryName   = "libmooncake_store.so"    // looked up on the loader path otherwise
	envTenant     = "MOONCAKE_TENANT_ID"      // read for its value's check only
	envHostname   = "MOONCAKE_LOCAL_HOSTNAME" // the rest mirror Mooncake's load_from_env
	envMetadata   = "MOONCAKE_TE_META_DATA_SERVER"
	envSegment    = "MOONCAKE_GLOBAL_SEGMENT_SIZE"
	envBuffer     = "MOONCAKE_LOCAL_BUFFER_SIZE"
	envProtocol   = "MOONCAKE_PROTOCOL"
	envDevice     = "MOONCAKE_DEVICE"
)

// protocols are the transports a Mooncake build may accept (the union of
// Transfer Engine transports and the store-only mode). A given build
// supports a subset; setup fails for the others.
var protocols = []string{
	"ascend", "barex", "cxl", "efa", "hip", "maca", "musa", "nvlink",
	"nvlink_intra", "nvmeof", "rdma", "rpc_only", "sunrise_link", "tcp", "ub", "ubshmem",
}

// Config is the configuration of a Mooncake Store client. Its JSON form is
// the file that MOONCAKE_CONFIG_PATH names for vLLM, SGLang and LMDeploy;
// see [ParseConfig] for the fields read.
type Config struct {
	// LocalHostname is this client's address as other clients reach it
	// ("host" or "host:port"; without a port Mooncake picks one in
	// 12300-14300). JSON local_hostname.
	LocalHostname string `json:"local_hostname"`
	// MetadataServer is the Transfer Engine metadata service:
	// "P2PHANDSHAKE" for none, an etcd address, or "http://host:port/metadata".
	// JSON metadata_server.
	MetadataServer string `json:"metadata_server"`
	// MasterServerAddress is the mooncake_master address, "host:port".
	// JSON master_server_address. Required.
	MasterServerAddress string `json:"master_server_address"`
	// GlobalSegmentSize is the memory this client contributes to the
	// shared pool; values of other clients may live in it, so the client
	// must stay up while they read. Zero contributes none. JSON
	// global_segment_size, a number of bytes or a string such as "4GB".
	GlobalSegmentSize Size `json:"global_segment_size"`
	// LocalBufferSize is the client's internal staging buffer. The
	// binding moves values straight from and to registered regions, so a
	// small buffer suffices. JSON local_buffer_size.
	LocalBufferSize Size `json:"local_buffer_size"`
	// Protocol is the transport: "tcp" (no special hardware) or "rdma"
	// (set DeviceName), or another one the library was built with.
	// JSON protocol; matched without regard to case.
	Protocol string `json:"protocol"`
	// DeviceName names the RDMA devices ("mlx5_0", "mlx5_0,mlx5_1",
	// "auto-discovery"); empty for tcp. JSON device_name.
	DeviceName string `json:"device_name"`

	// ReplicaNum is the number of replicas of each value; zero is the
	// master's default (1). JSON replica_num (read by this package only).
	ReplicaNum int `json:"replica_num,omitempty"`
	// PreferredSegments are the segments (client hostnames) to place
	// values in, when they have room. JSON preferred_segments (read by
	// this package only).
	PreferredSegments []string `json:"preferred_segments,omitempty"`

	// TenantID is accepted for compatibility with shared config files.
	// The C API has no tenant parameter, so only "" and "default" are
	// valid: separate tenants with key prefixes instead. JSON tenant_id.
	TenantID string `json:"tenant_id,omitempty"`

	// Library is the path of libmooncake_store.so. Empty: the
	// MOONCAKE_STORE_LIBRARY environment variable, then the loader path.
	Library string `json:"-"`
	// DeviceMemory allows registering device (accelerator) memory. Set it
	// only when the library was built with accelerator support, or native
	// code will fault on device addresses. Off, device regions are
	// rejected with store.ErrInvalidRegion.
	DeviceMemory bool `json:"-"`
	// PresenceOnly makes Exists report presence only, with Result.N 0,
	// in one native call per batch. Off, Exists also asks the size of each
	// key found, one more call (a request to the master) per key, as
	// store.Store's contract asks. Connector lookups need presence only:
	// set it for them. JSON presence_only (read by this package only).
	PresenceOnly bool `json:"presence_only,omitempty"`
	// RemoveLeaseWait bounds how long Remove retries a key that is under a
	// read lease (Mooncake refuses a removal without force while a lease
	// granted by an exists or a get lasts), with growing pauses between
	// tries; then Remove fails with an error matching store.ErrHasLease.
	// The binding never removes with force, which would free memory that a
	// get in flight still reads. Zero means DefaultRemoveLeaseWait;
	// NoRemoveWait (any negative value) does not retry. JSON
	// remove_lease_wait (read by this package only): a duration such as
	// "250ms" or a number of seconds, where 0 means no retry.
	RemoveLeaseWait time.Duration `json:"-"`
	// LeaseTTL is the read lease the master grants on every exists and
	// get (its --default_kv_lease_ttl), as [Store.Leases] reports it. The
	// C API cannot ask the master, so set it when the master runs with
	// another value than DefaultLeaseTTL; the binding does not time
	// anything by it. Zero means DefaultLeaseTTL; NoLeaseTTL (any negative
	// value) declares leases that end with their call. JSON
	// default_kv_lease_ttl (read by this package only), as the master's
	// flag takes it: a number of milliseconds, where 0 means NoLeaseTTL,
	// or a duration such as "10s".
	LeaseTTL time.Duration `json:"-"`
	// Logger receives the client's life-cycle events; nil discards them.
	Logger *slog.Logger `json:"-"`
}

// LoadConfig reads a JSON config file (see [ParseConfig]).
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("mooncake: config: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%w (in %s)", err, path)
	}
	return cfg, nil
}

// ParseConfig decodes a JSON config as Mooncake's loaders do: the fields
// local_hostname, metadata_server and master_server_address are required;
// global_segment_size and local_buffer_size default to 3.125 GiB and
// 1 GiB when absent and are numbers of bytes or strings such as "4GB" or
// "512 MB" (KB, MB, GB, TB or K, M, G, T, powers of 1024, case ignored);
// protocol defaults to "tcp" and is lower-cased; device_name may be null.
// replica_num and preferred_segments set the replication of puts,
// presence_only makes Exists answer presence alone, remove_lease_wait
// bounds how long Remove waits for a read lease to end, and
// default_kv_lease_ttl declares the master's lease (see Config). The
// fields mode, enable_offload, enable_ssd_offload, ssd_offload_path,
// enable_client_http_server and client_http_port are ignored, as are
// unknown fields. The result has [Config.EnsureDefaults] applied and is
// valid ([Config.Validate]). Every error names the field and its value.
func ParseConfig(data []byte) (Config, error) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&fields); err != nil {
		return Config{}, fmt.Errorf("mooncake: config: not a JSON object: %w", err)
	}
	if dec.More() {
		return Config{}, errors.New("mooncake: config: data after the JSON object")
	}
	if fields == nil {
		return Config{}, errors.New("mooncake: config: not a JSON object: null")
	}
	for _, name := range []string{"local_hostname", "metadata_server", "master_server_address"} {
		if _, ok := fields[name]; !ok {
			return Config{}, fmt.Errorf("mooncake: config: missing required field %s", name)
		}
	}
	cfg := Config{GlobalSegmentSize: DefaultGlobalSegmentSize, LocalBufferSize: DefaultLocalBufferSize}
	strs := []struct {
		name string
		dst  *string
	}{
		{"local_hostname", &cfg.LocalHostname},
		{"metadata_server", &cfg.MetadataServer},
		{"master_server_address", &cfg.MasterServerAddress},
		{"protocol", &cfg.Protocol},
		{"device_name", &cfg.DeviceName},
		{"tenant_id", &cfg.TenantID},
	}
	for _, f := range strs {
		raw, ok := fields[f.name]
		if !ok || string(raw) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return Config{}, fmt.Errorf("mooncake: config: field %s: want a string, got %s", f.name, clip(raw))
		}
	}
	for _, f := range []struct {
		name string
		dst  *Size
	}{{"global_segment_size", &cfg.GlobalSegmentSize}, {"local_buffer_size", &cfg.LocalBufferSize}} {
		if raw, ok := fields[f.name]; ok {
			if err := f.dst.UnmarshalJSON(raw); err != nil {
				return Config{}, fmt.Errorf("mooncake: config: field %s: %w", f.name, err)
			}
		}
	}
	if raw, ok := fields["presence_only"]; ok {
		if err := json.Unmarshal(raw, &cfg.PresenceOnly); err != nil {
			return Config{}, fmt.Errorf("mooncake: config: field presence_only: want true or false, got %s", clip(raw))
		}
	}
	if raw, ok := fields["remove_lease_wait"]; ok {
		d, err := parseWait(raw)
		if err != nil {
			return Config{}, fmt.Errorf("mooncake: config: field remove_lease_wait: %w", err)
		}
		cfg.RemoveLeaseWait = d
	}
	if raw, ok := fields["default_kv_lease_ttl"]; ok {
		d, err := parseTTL(raw)
		if err != nil {
			return Config{}, fmt.Errorf("mooncake: config: field default_kv_lease_ttl: %w", err)
		}
		cfg.LeaseTTL = d
	}
	if raw, ok := fields["replica_num"]; ok {
		if err := json.Unmarshal(raw, &cfg.ReplicaNum); err != nil {
			return Config{}, fmt.Errorf("mooncake: config: field replica_num: want a whole number, got %s", clip(raw))
		}
	}
	if raw, ok := fields["preferred_segments"]; ok {
		if err := json.Unmarshal(raw, &cfg.PreferredSegments); err != nil {
			return Config{}, fmt.Errorf("mooncake: config: field preferred_segments: want a list of strings, got %s", clip(raw))
		}
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// ConfigFromEnv returns the config that Mooncake's Python client would
// use: the file named by MOONCAKE_CONFIG_PATH if set, else one built from
// MOONCAKE_MASTER and the optional MOONCAKE_LOCAL_HOSTNAME,
// MOONCAKE_TE_META_DATA_SERVER, MOONCAKE_GLOBAL_SEGMENT_SIZE,
// MOONCAKE_LOCAL_BUFFER_SIZE, MOONCAKE_PROTOCOL, MOONCAKE_DEVICE and
// MOONCAKE_TENANT_ID. With neither set it returns an error wrapping
// store.ErrUnavailable.
func ConfigFromEnv() (Config, error) {
	if path := os.Getenv(EnvConfigPath); path != "" {
		return LoadConfig(path)
	}
	master := os.Getenv(EnvMaster)
	if master == "" {
		return Config{}, fmt.Errorf("%w: mooncake: neither %s nor %s is set", store.ErrUnavailable, EnvConfigPath, EnvMaster)
	}
	cfg := Config{
		LocalHostname:       os.Getenv(envHostname),
		MetadataServer:      os.Getenv(envMetadata),
		MasterServerAddress: master,
		GlobalSegmentSize:   DefaultGlobalSegmentSize,
		LocalBufferSize:     DefaultLocalBufferSize,
		Protocol:            os.Getenv(envProtocol),
		DeviceName:          os.Getenv(envDevice),
		TenantID:            os.Getenv(envTenant),
	}
	for _, f := range []struct {
		env string
		dst *Size
	}{{envSegment, &cfg.GlobalSegmentSize}, {envBuffer, &cfg.LocalBufferSize}} {
		if v := os.Getenv(f.env); v != "" {
			n, err := ParseSize(v)
			if err != nil {
				return Config{}, fmt.Errorf("mooncake: config: %s: %w", f.env, err)
			}
			*f.dst = n
		}
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// EnsureDefaults fills the empty fields that have a default: LocalHostname
// "localhost", MetadataServer "P2PHANDSHAKE", Protocol "tcp",
// RemoveLeaseWait [DefaultRemoveLeaseWait], LeaseTTL [DefaultLeaseTTL];
// it lower-cases Protocol and trims spaces around the strings; a negative
// RemoveLeaseWait becomes [NoRemoveWait], a negative LeaseTTL
// [NoLeaseTTL]. Sizes are left alone: zero means none (see
// [DefaultGlobalSegmentSize]). MasterServerAddress has no default.
func (c *Config) EnsureDefaults() {
	c.LocalHostname = strings.TrimSpace(c.LocalHostname)
	c.MetadataServer = strings.TrimSpace(c.MetadataServer)
	c.MasterServerAddress = strings.TrimSpace(c.MasterServerAddress)
	c.Protocol = strings.ToLower(strings.TrimSpace(c.Protocol))
	c.DeviceName = strings.TrimSpace(c.DeviceName)
	if c.LocalHostname == "" {
		c.LocalHostname = DefaultLocalHostname
	}
	if c.MetadataServer == "" {
		c.MetadataServer = DefaultMetadataServer
	}
	if c.Protocol == "" {
		c.Protocol = DefaultProtocol
	}
	switch {
	case c.RemoveLeaseWait == 0:
		c.RemoveLeaseWait = DefaultRemoveLeaseWait
	case c.RemoveLeaseWait < 0:
		c.RemoveLeaseWait = NoRemoveWait
	}
	switch {
	case c.LeaseTTL == 0:
		c.LeaseTTL = DefaultLeaseTTL
	case c.LeaseTTL < 0:
		c.LeaseTTL = NoLeaseTTL
	}
}

// Validate reports the first problem of c, naming the field and its value.
// Call it after [Config.EnsureDefaults].
func (c *Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("mooncake: config: field %s: "+format, append([]any{field}, args...)...)
	}
	for _, f := range []struct{ name, v string }{
		{"local_hostname", c.LocalHostname},
		{"metadata_server", c.MetadataServer},
		{"master_server_address", c.MasterServerAddress},
	} {
		if f.v == "" {
			return bad(f.name, "must not be empty")
		}
		if strings.ContainsFunc(f.v, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return bad(f.name, "%q contains spaces or control characters", f.v)
		}
	}
	if !slices.Contains(protocols, c.Protocol) {
		return bad("protocol", "unknown protocol %q (known: %s)", c.Protocol, strings.Join(protocols, ", "))
	}
	if strings.IndexByte(c.DeviceName, 0) >= 0 {
		return bad("device_name", "%q contains a NUL byte", c.DeviceName)
	}
	if c.ReplicaNum < 0 {
		return bad("replica_num", "%d is negative", c.ReplicaNum)
	}
	for i, s := range c.PreferredSegments {
		if s == "" || strings.IndexByte(s, 0) >= 0 {
			return bad("preferred_segments", "entry %d is %q: want a non-empty segment name", i, s)
		}
	}
	if c.TenantID != "" && c.TenantID != "default" {
		return bad("tenant_id", "%q: the C API has no tenant; leave it \"default\" and separate tenants by key prefix", c.TenantID)
	}
	if c.GlobalSegmentSize != 0 && c.GlobalSegmentSize < MinGlobalSegmentSize {
		return bad("global_segment_size", "%d bytes is less than Mooncake's minimum of %d (16MB); 0 contributes no segment", uint64(c.GlobalSegmentSize), uint64(MinGlobalSegmentSize))
	}
	if c.GlobalSegmentSize > maxSize {
		return bad("global_segment_size", "%d bytes is more than %d", uint64(c.GlobalSegmentSize), uint64(maxSize))
	}
	if c.LocalBufferSize > maxSize {
		return bad("local_buffer_size", "%d bytes is more than %d", uint64(c.LocalBufferSize), uint64(maxSize))
	}
	return nil
}

// Size is a number of bytes, written in JSON as a number or as a string
// with an optional unit (see [ParseSize]).
type Size uint64

// maxSize bounds a size at 1 PiB: larger values are typos.
const maxSize Size = 1 << 50

// ParseSize parses a size as Mooncake's config loaders do: a number of
// bytes ("1073741824", "1.5e9") or a number with a unit of KB, MB, GB, TB,
// K, M, G, T or B, powers of 1024, case ignored, spaces allowed ("4GB",
// "1.5 gb", "512m"). Fractional results are truncated to whole bytes.
func ParseSize(s string) (Size, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return 0, fmt.Errorf("invalid size %q: empty", s)
	}
	mult := 1.0
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30}, {"tb", 1 << 40},
		{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, {"b", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t = strings.TrimSpace(strings.TrimSuffix(t, u.suffix))
			mult = u.mult
			break
		}
	}
	if t == "" {
		return 0, fmt.Errorf("invalid size %q: no number before the unit", s)
	}
	if n, err := strconv.ParseUint(t, 10, 64); err == nil && mult == 1 {
		if Size(n) > maxSize {
			return 0, fmt.Errorf("invalid size %q: more than %d bytes", s, uint64(maxSize))
		}
		return Size(n), nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("invalid size %q: want bytes, or a number with a unit of KB, MB, GB or TB", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("invalid size %q: negative", s)
	}
	v := f * mult
	if v > float64(maxSize) {
		return 0, fmt.Errorf("invalid size %q: more than %d bytes", s, uint64(maxSize))
	}
	return Size(v), nil
}

// UnmarshalJSON accepts a whole non-negative number of bytes or a string
// that [ParseSize] accepts.
func (s *Size) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '"' {
		var str string
		if err := json.Unmarshal(data, &str); err != nil {
			return fmt.Errorf("invalid size %s: %w", clip(data), err)
		}
		n, err := ParseSize(str)
		if err != nil {
			return err
		}
		*s = n
		return nil
	}
	var num json.Number
	if err := json.Unmarshal(data, &num); err != nil {
		return fmt.Errorf("invalid size %s: want a number of bytes or a string such as \"4GB\"", clip(data))
	}
	if n, err := strconv.ParseUint(num.String(), 10, 64); err == nil {
		if Size(n) > maxSize {
			return fmt.Errorf("invalid size %s: more than %d bytes", num, uint64(maxSize))
		}
		*s = Size(n)
		return nil
	}
	f, err := num.Float64()
	if err != nil || f < 0 || f != math.Trunc(f) {
		return fmt.Errorf("invalid size %s: want a whole non-negative number of bytes", num)
	}
	if f > float64(maxSize) {
		return fmt.Errorf("invalid size %s: more than %d bytes", num, uint64(maxSize))
	}
	*s = Size(f)
	return nil
}

// MarshalJSON writes the size as a number of bytes.
func (s Size) MarshalJSON() ([]byte, error) {
	return strconv.AppendUint(nil, uint64(s), 10), nil
}

// String writes the size in the largest binary unit that divides it, such
// as "4GB" or "1536MB", or in bytes.
func (s Size) String() string {
	for _, u := range []struct {
		name string
		n    Size
	}{{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10}} {
		if s >= u.n && s%u.n == 0 {
			return strconv.FormatUint(uint64(s/u.n), 10) + u.name
		}
	}
	return strconv.FormatUint(uint64(s), 10)
}

// maxWaitSeconds bounds remove_lease_wait: an hour is longer than any
// lease worth waiting out.
const maxWaitSeconds = 3600

// parseWait reads remove_lease_wait: a Go duration string or a number of
// seconds, from 0 (no retry, NoRemoveWait) to an hour.
func parseWait(raw json.RawMessage) (time.Duration, error) {
	var d time.Duration
	var str string
	var num float64
	switch {
	case json.Unmarshal(raw, &str) == nil:
		var err error
		if d, err = time.ParseDuration(str); err != nil {
			return 0, fmt.Errorf("invalid duration %s: want a duration such as \"250ms\" or a number of seconds", clip(raw))
		}
	case json.Unmarshal(raw, &num) == nil:
		if num < 0 || num > maxWaitSeconds {
			return 0, fmt.Errorf("%s seconds: want 0 to %d", clip(raw), maxWaitSeconds)
		}
		d = time.Duration(num * float64(time.Second))
	default:
		return 0, fmt.Errorf("invalid duration %s: want a duration such as \"250ms\" or a number of seconds", clip(raw))
	}
	if d < 0 || d > maxWaitSeconds*time.Second {
		return 0, fmt.Errorf("%s: want 0 to %ds", clip(raw), maxWaitSeconds)
	}
	if d == 0 {
		return NoRemoveWait, nil
	}
	return d, nil
}

// maxTTL bounds default_kv_lease_ttl: a day is longer than any lease a
// cache would grant.
const maxTTL = 24 * time.Hour

// parseTTL reads default_kv_lease_ttl as mooncake_master's flag takes it:
// a whole number of milliseconds, or a Go duration string, from 0
// (NoLeaseTTL) to a day.
func parseTTL(raw json.RawMessage) (time.Duration, error) {
	var d time.Duration
	var str string
	var num json.Number
	const want = "want a number of milliseconds or a duration such as \"10s\""
	switch {
	case json.Unmarshal(raw, &str) == nil:
		var err error
		if d, err = time.ParseDuration(str); err != nil {
			return 0, fmt.Errorf("invalid duration %s: %s", clip(raw), want)
		}
	case json.Unmarshal(raw, &num) == nil:
		ms, err := strconv.ParseInt(num.String(), 10, 64)
		if err != nil || ms < 0 || ms > maxTTL.Milliseconds() {
			return 0, fmt.Errorf("%s: want a whole number of milliseconds from 0 to %d", clip(raw), maxTTL.Milliseconds())
		}
		d = time.Duration(ms) * time.Millisecond
	default:
		return 0, fmt.Errorf("invalid duration %s: %s", clip(raw), want)
	}
	if d < 0 || d > maxTTL {
		return 0, fmt.Errorf("%s: want 0 to %v", clip(raw), maxTTL)
	}
	if d == 0 {
		return NoLeaseTTL, nil
	}
	return d, nil
}

// clip quotes a raw JSON value for an error message, shortened.
func clip(raw []byte) string {
	const max = 64
	if len(raw) > max {
		return string(raw[:max]) + "..."
	}
	return string(raw)
}
