package store_test

import (
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvconnect/kvconnect/store"
)

// validBytes is the definition ValidateKey implements, byte by byte.
func validBytes(key string) bool {
	if len(key) == 0 || len(key) > store.MaxKeyLen {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

func TestValidateKey(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want string // "" for valid
	}{
		{"a", ""},
		{"tenant@ns@0123456789abcdef", ""},
		{"!~" + strings.Repeat("x", 14), ""},
		{strings.Repeat("k", store.MaxKeyLen), ""},
		{"", "empty key"},
		{strings.Repeat("k", store.MaxKeyLen+1), "key of 513 bytes is longer than 512"},
		{"has space", `key "has space" has byte 0x20 at 3`},
		{"0123456789abcdef\x7f", "has byte 0x7f at 16"},
		{"01234567\x80", "has byte 0x80 at 8"},
		{"0123456\xff9", "has byte 0xff at 7"},
		{"\x00", "has byte 0x0 at 0"},
		{"abcdefgh ", "has byte 0x20 at 8"},
	} {
		err := store.ValidateKey(tc.key)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("ValidateKey(%.20q) = %v, want nil", tc.key, err)
		case tc.want != "" && (!errors.Is(err, store.ErrInvalidKey) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("ValidateKey(%.20q) = %v, want store.ErrInvalidKey containing %q", tc.key, err, tc.want)
		}
	}
}

// TestValidateKeyMatchesDefinition checks the word-at-a-time validation
// against the byte-by-byte definition, on keys that mix valid bytes with
// the bytes around both edges of the valid range.
func TestValidateKeyMatchesDefinition(t *testing.T) {
	edge := rapid.SampledFrom([]byte{0x00, 0x01, 0x1f, 0x20, 0x21, 0x22, 0x41, 0x7d, 0x7e, 0x7f, 0x80, 0x81, 0xfe, 0xff})
	rapid.Check(t, func(t *rapid.T) {
		b := rapid.SliceOfN(rapid.OneOf(edge, rapid.Byte()), 0, store.MaxKeyLen+2).Draw(t, "key")
		key := string(b)
		if got, want := store.ValidateKey(key) == nil, validBytes(key); got != want {
			t.Fatalf("ValidateKey(%q) valid = %v, want %v", key, got, want)
		}
	})
}

func TestCheckBatch(t *testing.T) {
	for _, tc := range []struct {
		keys, regions, res int
		want               string
	}{
		{2, 2, 2, ""},
		{2, -1, 2, ""},
		{0, 0, 0, ""},
		{2, 1, 2, "store: put: 2 keys but 1 regions"},
		{2, 2, 3, "store: put: 2 keys but 3 result slots"},
		{2, -1, 1, "store: put: 2 keys but 1 result slots"},
	} {
		err := store.CheckBatch("put", tc.keys, tc.regions, tc.res)
		if got := ""; err != nil {
			got = err.Error()
			if got != tc.want {
				t.Errorf("CheckBatch(put, %d, %d, %d) = %q, want %q", tc.keys, tc.regions, tc.res, got, tc.want)
			}
		} else if tc.want != "" {
			t.Errorf("CheckBatch(put, %d, %d, %d) = nil, want %q", tc.keys, tc.regions, tc.res, tc.want)
		}
	}
}

func BenchmarkValidateKey(b *testing.B) {
	key := "tenant-a@00000000feedfacecafe@r0@" + strings.Repeat("0123456789abcdef", 4)
	for b.Loop() {
		if err := store.ValidateKey(key); err != nil {
			b.Fatal(err)
		}
	}
}
