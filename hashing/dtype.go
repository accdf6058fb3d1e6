package hashing

import (
	"fmt"
	"strings"
)

// DType names the element type of model weights or of a KV cache. The
// canonical names are the constants below; [ParseDType] also accepts common
// aliases such as "float16" and "bfloat16". "auto" is not a DType: an
// identity must name the dtype the cache actually holds, so resolve "auto"
// (for example to the model's dtype) before building one.
type DType string

// Known dtypes. The FP8 variants differ in the meaning of their bytes, so
// each has its own name: e4m3 and e5m2 are the OCP formats (PyTorch's
// float8_e4m3fn and float8_e5m2); the "fnuz" variants are the ones AMD's
// MI300 series uses.
const (
	FP32        DType = "fp32"
	FP16        DType = "fp16"
	BF16        DType = "bf16"
	FP8E4M3     DType = "fp8_e4m3"
	FP8E5M2     DType = "fp8_e5m2"
	FP8E4M3FNUZ DType = "fp8_e4m3fnuz"
	FP8E5M2FNUZ DType = "fp8_e5m2fnuz"
	INT8        DType = "int8"
	INT4        DType = "int4"
	FP4E2M1     DType = "fp4_e2m1"
)

// alias is a name that [ParseDType] accepts for a canonical dtype.
type alias struct {
	name  string // normalised: see normDType
	dtype DType
}

// dtypeAliases returns every alias that ParseDType accepts, with the dtype
// each names, in the order of SPEC.md's table (which a test checks against
// this list).
func dtypeAliases() []alias {
	return []alias{
		{"float32", FP32}, {"float", FP32},
		{"float16", FP16}, {"half", FP16},
		{"bfloat16", BF16},
		{"float8_e4m3fn", FP8E4M3}, {"fp8_e4m3fn", FP8E4M3}, {"e4m3", FP8E4M3},
		{"float8_e5m2", FP8E5M2}, {"e5m2", FP8E5M2},
		{"float8_e4m3fnuz", FP8E4M3FNUZ},
		{"float8_e5m2fnuz", FP8E5M2FNUZ},
		{"uint4", INT4},
		{"float4_e2m1fn_x2", FP4E2M1}, {"fp4", FP4E2M1}, {"e2m1", FP4E2M1},
	}
}

// dtypeAlias returns the canonical dtype that a normalised alias names.
func dtypeAlias(l string) (DType, bool) {
	for _, a := range dtypeAliases() {
		if a.name == l {
			return a.dtype, true
		}
	}
	return "", false
}

// normDType normalises a dtype name as ParseDType does before looking it
// up: leading and trailing ASCII white space (tab, newline, vertical tab,
// form feed, carriage return, space) removed and ASCII letters A-Z
// lower-cased. Nothing else changes: other bytes, and non-ASCII letters in
// particular, stay as they are, so "İNT8" is not "int8".
func normDType(s string) string {
	b := []byte(strings.Trim(s, " \t\n\v\f\r"))
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}

// DTypes returns the canonical dtypes, in a fixed order.
func DTypes() []DType {
	return []DType{FP32, FP16, BF16, FP8E4M3, FP8E5M2, FP8E4M3FNUZ, FP8E5M2FNUZ, INT8, INT4, FP4E2M1}
}

// String returns the dtype's name.
func (d DType) String() string { return string(d) }

// Known reports whether d is one of the canonical dtypes.
func (d DType) Known() bool {
	switch d {
	case FP32, FP16, BF16, FP8E4M3, FP8E5M2, FP8E4M3FNUZ, FP8E5M2FNUZ, INT8, INT4, FP4E2M1:
		return true
	}
	return false
}

// MarshalText returns the dtype's name.
func (d DType) MarshalText() ([]byte, error) { return []byte(d), nil }

// UnmarshalText parses a dtype as [ParseDType] does, so configuration files
// may use aliases. The empty string is the empty DType (no dtype, as for a
// model without MLA), the value MarshalText gives for it; [Identity.Validate]
// reports it where a dtype is required.
func (d *DType) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*d = ""
		return nil
	}
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// ParseDType returns the canonical dtype that s names, ignoring ASCII case
// and surrounding ASCII white space, and accepting common aliases
// ("float16", "half", "bfloat16", "float8_e4m3fn", ...: the complete table
// is in SPEC.md, section 5). It rejects "auto", the empty string and the
// ambiguous "fp8" with an error saying what to give instead, and any other
// unknown name with the list of known ones.
func ParseDType(s string) (DType, error) {
	l := normDType(s)
	if d := DType(l); d.Known() {
		return d, nil
	}
	if d, ok := dtypeAlias(l); ok {
		return d, nil
	}
	return "", &FieldError{Field: "dtype", Value: quoteTrunc(s), Reason: dtypeHint(l)}
}

// dtypeHint explains why a normalised name is not a dtype.
func dtypeHint(l string) string {
	switch l {
	case "auto", "":
		return "not a dtype: name the dtype the cache actually holds (resolve \"auto\", for example to the model dtype)"
	case "fp8", "float8":
		return "ambiguous: say fp8_e4m3, fp8_e5m2, fp8_e4m3fnuz or fp8_e5m2fnuz"
	}
	if d, ok := dtypeAlias(l); ok {
		return fmt.Sprintf("not a canonical name: use %s (ParseDType accepts aliases)", d)
	}
	var names []string
	for _, d := range DTypes() {
		names = append(names, string(d))
	}
	return fmt.Sprintf("unknown dtype (known: %s)", strings.Join(names, ", "))
}
