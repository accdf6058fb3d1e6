package hashing

import (
	"errors"
	"fmt"
)

// FieldError reports one invalid field of an [Identity], of a chain's
// parameters or of an [Extra]. Validation errors returned by this package
// are a *FieldError, or several joined with [errors.Join]; match them with
// [errors.As].
type FieldError struct {
	Field  string // the field, such as "Layout.Replication" or "extras[1].offset"
	Value  string // the offending value as Go syntax (strings quoted)
	Reason string // what is wrong and, where it helps, what to do
}

// Error returns "hashing: <Field> = <Value>: <Reason>".
func (e *FieldError) Error() string {
	return fmt.Sprintf("hashing: %s = %s: %s", e.Field, e.Value, e.Reason)
}

// ErrMalformedKey is wrapped by every error of [ParseKey] and [ParseBlockHash].
var ErrMalformedKey = errors.New("hashing: malformed key")

// ErrMalformedIdentity is wrapped by every error of [Identity.UnmarshalBinary]
// that comes from the bytes themselves (as opposed to a decoded identity
// that fails [Identity.Validate]).
var ErrMalformedIdentity = errors.New("hashing: malformed identity encoding")

func fieldErr(field string, value any, reason string, args ...any) *FieldError {
	v := ""
	switch x := value.(type) {
	case raw:
		v = string(x)
	case string:
		v = quoteTrunc(x)
	case DType:
		v = quoteTrunc(string(x))
	default:
		v = fmt.Sprint(x)
	}
	return &FieldError{Field: field, Value: v, Reason: fmt.Sprintf(reason, args...)}
}

// raw is a value that fieldErr shows as it is, unquoted.
type raw string

// quoteTrunc quotes s, cutting it to a readable length so that an error
// message never carries megabytes of input.
func quoteTrunc(s string) string {
	const max = 200
	if len(s) <= max {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:max], len(s))
}

// joinErrs returns the only error, or all of them joined.
func joinErrs(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}
