// Package mapped checks that a span of addresses is mapped memory of this
// process, before an address is handed to native code that would fault on
// an unmapped one.
package mapped

import "errors"

// ErrUnsupported is returned where the check cannot be made.
var ErrUnsupported = errors.ErrUnsupported
