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

// dtypeAlias returns the canonical dtype that a lower-case alias names.
func dtypeAlias(l string) (DType, bool) {
	switch l {
	case "float32", "float":
		return FP32, true
	case "float16", "half":
		return FP16, true
	case "bfloat16":
		return BF16, true
	case "float8_e4m3fn", "fp8_e4m3fn", "e4m3":
		return FP8E4M3, true
	case "float8_e5m2", "e5m2":
		return FP8E5M2, true
	case "float8_e4m3fnuz":
		return FP8E4M3FNUZ, true
	case "float8_e5m2fnuz":
		return FP8E5M2FNUZ, true
	case "uint4":
		return INT4, true
	case "float4_e2m1fn_x2", "fp4", "e2m1":
		return FP4E2M1, true
	}
	return "", false
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
// may use aliases.
func (d *DType) UnmarshalText(b []byte) error {
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// ParseDType returns the canonical dtype that s names, ignoring case and
// accepting common aliases ("float16", "half", "bfloat16", "float8_e4m3fn",
// ...). It rejects "auto" and the ambiguous "fp8" with an error saying what
// to give instead, and any other unknown name with the list of known ones.
func ParseDType(s string) (DType, error) {
	l := strings.ToLower(strings.TrimSpace(s))
	if d := DType(l); d.Known() {
		return d, nil
	}
	if d, ok := dtypeAlias(l); ok {
		return d, nil
	}
	return "", &FieldError{Field: "dtype", Value: quoteTrunc(s), Reason: dtypeHint(l)}
}

// dtypeHint explains why a lower-cased name is not a dtype.
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
