package main

import (
	"strings"
	"testing"
)

// TestFlagMisuse: a negative -weight-update-at and arguments left after
// the flags are errors naming them, not a run that ignores them.
func TestFlagMisuse(t *testing.T) {
	o := defaultOptions()
	o.WeightUpdateAt = -3
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "-weight-update-at = -3, want >= 0") {
		t.Errorf("Validate(-weight-update-at -3) = %v, want an error naming it", err)
	}
	if err := noArgs([]string{"2", "-pd"}); err == nil || !strings.Contains(err.Error(), `unexpected argument "2" (2 in all)`) {
		t.Errorf("noArgs(2 -pd) = %v, want an error naming the stray argument", err)
	}
	if err := noArgs(nil); err != nil {
		t.Errorf("noArgs() = %v, want nil", err)
	}
}
