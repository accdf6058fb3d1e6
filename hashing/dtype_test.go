package hashing

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSpecDTypeTable checks SPEC.md's dtype table against the package's
// dtypes and aliases, both ways: every row names a canonical dtype in the
// order of DTypes, and its aliases are exactly those ParseDType accepts for
// it, in the order of dtypeAliases.
func TestSpecDTypeTable(t *testing.T) {
	spec, err := os.ReadFile("SPEC.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(spec), "| dtype | aliases | elements |\n| --- | --- | --- |\n")
	if !ok {
		t.Fatal("SPEC.md has no dtype table (| dtype | aliases | elements |)")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	code := regexp.MustCompile("`([^`]*)`")
	var dtypes []DType
	var aliases []alias
	for _, row := range strings.Split(table, "\n") {
		cells := strings.Split(row, "|")
		if len(cells) != 5 {
			t.Fatalf("SPEC.md dtype table: row %q has %d cells, want 3", row, len(cells)-2)
		}
		name := code.FindStringSubmatch(cells[1])
		if name == nil {
			t.Fatalf("SPEC.md dtype table: row %q names no dtype", row)
		}
		d := DType(name[1])
		dtypes = append(dtypes, d)
		for _, a := range code.FindAllStringSubmatch(cells[2], -1) {
			aliases = append(aliases, alias{a[1], d})
		}
	}
	if diff := cmp.Diff(DTypes(), dtypes); diff != "" {
		t.Errorf("SPEC.md dtypes (-DTypes() +SPEC.md):\n%s", diff)
	}
	if diff := cmp.Diff(dtypeAliases(), aliases, cmp.AllowUnexported(alias{})); diff != "" {
		t.Errorf("SPEC.md aliases (-package +SPEC.md):\n%s", diff)
	}
}

// TestDTypeAliases checks the alias table itself: aliases are normalised,
// distinct, never a canonical name, and each parses to its dtype in any
// ASCII case, while Validate takes canonical names only.
func TestDTypeAliases(t *testing.T) {
	seen := map[string]bool{}
	for _, a := range dtypeAliases() {
		if seen[a.name] {
			t.Errorf("alias %q listed twice", a.name)
		}
		seen[a.name] = true
		if normDType(a.name) != a.name || DType(a.name).Known() || !a.dtype.Known() {
			t.Errorf("alias %q -> %q: not normalised, a canonical name itself, or naming an unknown dtype", a.name, a.dtype)
		}
		for _, in := range []string{a.name, strings.ToUpper(a.name), " " + a.name + "\t"} {
			if got, err := ParseDType(in); got != a.dtype || err != nil {
				t.Errorf("ParseDType(%q) = %q, %v; want %q", in, got, err, a.dtype)
			}
		}
		if err := checkDType("Format.KVDType", DType(a.name), false); err == nil ||
			!strings.Contains(err.Error(), "not a canonical name: use "+string(a.dtype)) {
			t.Errorf("checkDType(%q) = %v, want an error naming %s", a.name, err, a.dtype)
		}
	}
}

// TestParseDTypeNormalisation pins what normalisation does: ASCII white
// space at the ends and ASCII case, nothing else.
func TestParseDTypeNormalisation(t *testing.T) {
	tests := []struct {
		in   string
		want DType // "" = rejected
	}{
		{"BF16", BF16},
		{"Float8_E4M3FN", FP8E4M3},
		{"\t\n\v\f\r fp16 \r\f\v\n\t", FP16},
		{"bf 16", ""},      // inner space
		{"\u00a0fp16", ""}, // no-break space is not ASCII white space
		{"fp16\u0085", ""}, // nor is NEL
		{"\u3000bf16", ""}, // nor the ideographic space
		{"\u0130NT8", ""},  // İ is not I
		{"\u212a", ""},     // the Kelvin sign is not k
		{"fp16\x00", ""},   // NUL is not white space
		{"ｆｐ１６", ""},       // full-width letters
		{"int８", ""},       // a full-width digit
		{"Auto", ""},
		{" ", ""},
		{"FP8", ""},
	}
	for _, tt := range tests {
		got, err := ParseDType(tt.in)
		if got != tt.want || (err == nil) != (tt.want != "") {
			t.Errorf("ParseDType(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestDTypeText(t *testing.T) {
	var d DType = FP16
	if err := d.UnmarshalText(nil); err != nil || d != "" {
		t.Errorf("UnmarshalText(\"\") = %v, dtype %q; want nil, \"\"", err, d)
	}
	if err := d.UnmarshalText([]byte(" ")); err == nil || !strings.Contains(err.Error(), "not a dtype") {
		t.Errorf("UnmarshalText(\" \") = %v, want an error: only the exact empty string is no dtype", err)
	}
	if err := d.UnmarshalText([]byte("HALF")); err != nil || d != FP16 {
		t.Errorf("UnmarshalText(\"HALF\") = %v, dtype %q; want nil, fp16", err, d)
	}
	if b, err := DType("").MarshalText(); len(b) != 0 || err != nil {
		t.Errorf("MarshalText of the empty DType = %q, %v", b, err)
	}
}
