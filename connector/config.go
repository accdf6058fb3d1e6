package connector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Role is which side of a KV transfer an engine instance plays.
type Role string

const (
	RoleProducer Role = "kv_producer" // saves KV only
	RoleConsumer Role = "kv_consumer" // loads KV only
	RoleBoth     Role = "kv_both"     // saves and loads
)

// CanSave reports whether the role saves blocks.
func (r Role) CanSave() bool { return r == RoleProducer || r == RoleBoth }

// CanLoad reports whether the role loads blocks.
func (r Role) CanLoad() bool { return r == RoleConsumer || r == RoleBoth }

// Policy is what happens to a request whose external KV failed to load.
type Policy string

const (
	// PolicyRecompute rolls the request back to its last valid prefix and
	// recomputes the rest. The default.
	PolicyRecompute Policy = "recompute"
	// PolicyFail fails the request.
	PolicyFail Policy = "fail"
)

// Config is a connector's configuration: the kv_transfer_config JSON that
// vLLM and LMDeploy accept, so one file can configure either engine or a Go
// engine. Fields vLLM defines that no kvconnect connector uses (the
// network fields of its P2P connectors, say) are accepted and kept, so a
// config round-trips; unknown fields are an error, since a misspelt field
// would otherwise be silently ignored.
type Config struct {
	Connector         string         `json:"kv_connector"`
	Role              Role           `json:"kv_role"`
	LoadFailurePolicy Policy         `json:"kv_load_failure_policy,omitempty"`
	Extra             map[string]any `json:"kv_connector_extra_config,omitempty"`

	EngineID           string `json:"engine_id,omitempty"`
	BufferDevice       string `json:"kv_buffer_device,omitempty"`
	BufferSize         any    `json:"kv_buffer_size,omitempty"`
	Rank               *int   `json:"kv_rank,omitempty"`
	ParallelSize       *int   `json:"kv_parallel_size,omitempty"`
	IP                 string `json:"kv_ip,omitempty"`
	Port               *int   `json:"kv_port,omitempty"`
	ModulePath         string `json:"kv_connector_module_path,omitempty"`
	EnablePermuteLocal *bool  `json:"enable_permute_local_kv,omitempty"`
}

// Format implements fmt.Formatter: a Config prints as a struct of its
// fields does, with every verb, except that the value of a
// kv_connector_extra_config key that names a secret (a key that ends in
// "_key", "secret", "password" or "token", such as storeconn's
// "verify_key") prints as "[secret]". So a config in a log line or an
// error never carries a secret. JSON keeps it: a config round-trips.
func (c Config) Format(f fmt.State, verb rune) {
	type plain Config // the fields without this method
	p := plain(c)
	for k := range c.Extra {
		if secretKey(k) {
			p.Extra = make(map[string]any, len(c.Extra))
			for k, v := range c.Extra {
				if secretKey(k) && v != nil {
					v = "[secret]"
				}
				p.Extra[k] = v
			}
			break
		}
	}
	fmt.Fprintf(f, fmt.FormatString(f, verb), p)
}

// secretKey reports whether kv_connector_extra_config key names a secret,
// which Config's Format does not print.
func secretKey(key string) bool {
	for _, suffix := range []string{"_key", "secret", "password", "token"} {
		if strings.HasSuffix(key, suffix) {
			return true
		}
	}
	return false
}

// ParseConfig decodes a kv_transfer_config JSON object, fills defaults and
// validates it. Errors name the offending field and value.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(&c); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Config{}, fmt.Errorf("%w: field %q: %s is not a %s", ErrConfig, te.Field, te.Value, te.Type)
		}
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if dec.More() {
		return Config{}, fmt.Errorf("%w: trailing data after the JSON object", ErrConfig)
	}
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// EnsureDefaults fills unset fields with their defaults: role kv_both and
// policy recompute.
func (c *Config) EnsureDefaults() {
	if c.Role == "" {
		c.Role = RoleBoth
	}
	if c.LoadFailurePolicy == "" {
		c.LoadFailurePolicy = PolicyRecompute
	}
}

// Validate reports the first field that is missing or out of range.
func (c Config) Validate() error {
	if c.Connector == "" {
		return fmt.Errorf("%w: kv_connector is empty", ErrConfig)
	}
	switch c.Role {
	case RoleProducer, RoleConsumer, RoleBoth:
	default:
		return fmt.Errorf("%w: kv_role = %q, want kv_producer, kv_consumer or kv_both", ErrConfig, c.Role)
	}
	switch c.LoadFailurePolicy {
	case PolicyRecompute, PolicyFail:
	default:
		return fmt.Errorf("%w: kv_load_failure_policy = %q, want recompute or fail", ErrConfig, c.LoadFailurePolicy)
	}
	if c.Rank != nil && *c.Rank < 0 {
		return fmt.Errorf("%w: kv_rank = %d, want >= 0", ErrConfig, *c.Rank)
	}
	if c.ParallelSize != nil && *c.ParallelSize < 1 {
		return fmt.Errorf("%w: kv_parallel_size = %d, want >= 1", ErrConfig, *c.ParallelSize)
	}
	if c.Rank != nil && c.ParallelSize != nil && *c.Rank >= *c.ParallelSize {
		return fmt.Errorf("%w: kv_rank = %d, want < kv_parallel_size (%d)", ErrConfig, *c.Rank, *c.ParallelSize)
	}
	if c.Port != nil && (*c.Port < 0 || *c.Port > 65535) {
		return fmt.Errorf("%w: kv_port = %d, want 0 to 65535", ErrConfig, *c.Port)
	}
	return nil
}

// CheckExtra returns an error naming the first key of
// kv_connector_extra_config (in sorted order) that is not among known, the
// keys a connector reads, with the closest known key when one is near: a
// misspelt key would otherwise be silently ignored. Connectors call it when
// they open.
func (c Config) CheckExtra(known ...string) error {
	keys := make([]string, 0, len(c.Extra))
	for k := range c.Extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if slices.Contains(known, k) {
			continue
		}
		sorted := slices.Sorted(slices.Values(known))
		best, dist := "", 4 // suggest only keys a few edits away
		for _, kn := range sorted {
			if d := editDistance(k, kn); d < dist {
				best, dist = kn, d
			}
		}
		if best != "" {
			return fmt.Errorf("%w: kv_connector_extra_config.%s is not a key of %s (did you mean %q?)", ErrConfig, k, c.Connector, best)
		}
		return fmt.Errorf("%w: kv_connector_extra_config.%s is not a key of %s; its keys are %s", ErrConfig, k, c.Connector, strings.Join(sorted, ", "))
	}
	return nil
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func (c Config) extra(key string) (any, bool) {
	v, ok := c.Extra[key]
	return v, ok && v != nil
}

func extraErr(key string, v any, want string) error {
	return fmt.Errorf("%w: kv_connector_extra_config.%s = %v, want %s", ErrConfig, key, v, want)
}

// ExtraString returns the string kv_connector_extra_config[key], or def when
// it is absent.
func (c Config) ExtraString(key, def string) (string, error) {
	v, ok := c.extra(key)
	if !ok {
		return def, nil
	}
	s, ok := v.(string)
	if !ok {
		return def, extraErr(key, v, "a string")
	}
	return s, nil
}

// ExtraChoice returns the string kv_connector_extra_config[key], which
// must be one of choices, or def when it is absent.
func (c Config) ExtraChoice(key, def string, choices ...string) (string, error) {
	v, err := c.ExtraString(key, def)
	if err != nil {
		return def, err
	}
	if !slices.Contains(choices, v) {
		return def, fmt.Errorf("%w: kv_connector_extra_config.%s = %q, want %s", ErrConfig, key, v, strings.Join(choices, " or "))
	}
	return v, nil
}

// ExtraInt returns the integer kv_connector_extra_config[key], or def when
// it is absent. It accepts JSON numbers and numeric strings.
func (c Config) ExtraInt(key string, def int) (int, error) {
	v, ok := c.extra(key)
	if !ok {
		return def, nil
	}
	var s string
	switch x := v.(type) {
	case json.Number:
		s = x.String()
	case float64:
		s = strconv.FormatFloat(x, 'f', -1, 64)
	case int:
		return x, nil
	case string:
		s = x
	default:
		return def, extraErr(key, v, "an integer")
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return def, extraErr(key, v, "an integer")
	}
	return n, nil
}

// ExtraBool returns the boolean kv_connector_extra_config[key], or def when
// it is absent.
func (c Config) ExtraBool(key string, def bool) (bool, error) {
	v, ok := c.extra(key)
	if !ok {
		return def, nil
	}
	switch x := v.(type) {
	case bool:
		return x, nil
	case string:
		if b, err := strconv.ParseBool(x); err == nil {
			return b, nil
		}
	}
	return def, extraErr(key, v, "a boolean")
}

// maxSeconds is the longest duration, in seconds, a time.Duration holds.
const maxSeconds = float64(math.MaxInt64) / float64(time.Second)

// ExtraDuration returns the duration kv_connector_extra_config[key], or def
// when it is absent. It accepts Go duration strings ("250ms") and numbers of
// seconds.
func (c Config) ExtraDuration(key string, def time.Duration) (time.Duration, error) {
	v, ok := c.extra(key)
	if !ok {
		return def, nil
	}
	switch x := v.(type) {
	case string:
		if d, err := time.ParseDuration(x); err == nil && d >= 0 {
			return d, nil
		}
	case json.Number:
		if f, err := x.Float64(); err == nil && f >= 0 && f <= maxSeconds {
			return time.Duration(f * float64(time.Second)), nil
		}
	case float64:
		if x >= 0 && x <= maxSeconds {
			return time.Duration(x * float64(time.Second)), nil
		}
	}
	return def, extraErr(key, v, "a duration such as \"250ms\" or a number of seconds")
}
