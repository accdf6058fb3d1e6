package hashing

import "testing"

// TestUint64SpecTable checks the table of SPEC.md, section 11, which
// vectors.json repeats under "folds".
func TestUint64SpecTable(t *testing.T) {
	tests := []struct {
		hash string
		want uint64
	}{
		{"ffffffffffffffffffffffffffffffffffffffffffffffff0000000000000000", 0},
		{"0000000000000000000000000000000000000000000000000000000000000001", 1},
		{"a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a57fffffffffffffff", 9223372036854775807},
		{"0000000000000000000000000000000000000000000000008000000000000000", 9223372036854775808},
		{"ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", 18446744073709551615},
		{"943c6b41e951d729144aceb9441dde9d20eb2fe56c4604f571021a1b4979215b", 8143099780738392411},
	}
	for _, tt := range tests {
		h, err := ParseBlockHash(tt.hash)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.Uint64(); got != tt.want {
			t.Errorf("%s.Uint64() = %d, want %d", tt.hash, got, tt.want)
		}
	}
}
