package remote

import (
	"fmt"
	"log/slog"
	"os"
)

// SecretEnv is the environment variable that [ServerOptions.EnsureDefaults]
// and [ClientOptions.EnsureDefaults] read a shared secret from when the
// options carry none.
const SecretEnv = "KVCONNECT_REMOTE_SECRET"

// MinSecretLen is the shortest shared secret taken, in bytes.
const MinSecretLen = 16

// Secret is a shared secret that a server and its clients prove to each
// other when a connection starts (see "Security" in the package doc). It
// never crosses the wire, and it prints as "[secret]" with every verb of
// package fmt, in log/slog records and as JSON, so that options printed whole, in
// a log or an error text, do not reveal it.
type Secret []byte

// String returns "[secret]", or "[none]" for an empty secret.
func (s Secret) String() string {
	if len(s) == 0 {
		return "[none]"
	}
	return "[secret]"
}

// Format prints s as String does, whatever the verb.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.String())) }

// MarshalText hides s from encoding/json and the like.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// LogValue hides s from log/slog records.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// secretFromEnv returns s, or when s is empty the secret of SecretEnv, if
// set.
func secretFromEnv(s Secret) Secret {
	if len(s) == 0 {
		if v := os.Getenv(SecretEnv); v != "" {
			return Secret(v)
		}
	}
	return s
}

// checkSecret reports a secret too short to be one, naming the field and
// the secret's length, never its bytes.
func checkSecret(who string, s Secret) error {
	if len(s) > 0 && len(s) < MinSecretLen {
		return fmt.Errorf("remote: %s options: Secret of %d bytes: must be at least %d bytes (or none)", who, len(s), MinSecretLen)
	}
	return nil
}

// needsSecret reports whether connections on network must prove a shared
// secret: every network but "unix", whose sockets Listen makes reachable
// by their owner only.
func needsSecret(network string) bool { return network != "unix" }
