package connector

import "errors"

// Errors the package and its connectors return.
var (
	// ErrUnknownRequest: a call names a request the connector does not know.
	ErrUnknownRequest = errors.New("connector: unknown request")
	// ErrInvalidBlock: a block id lies outside the registered KV memory, or
	// a request's blocks do not cover the tokens a call names.
	ErrInvalidBlock = errors.New("connector: invalid block")
	// ErrNotRegistered: a worker was started before Register.
	ErrNotRegistered = errors.New("connector: KV memory not registered")
	// ErrClosed: the connector half was closed.
	ErrClosed = errors.New("connector: closed")
	// ErrBadMetadata: Metadata or Output bytes do not decode.
	ErrBadMetadata = errors.New("connector: malformed metadata")
	// ErrConfig: a Config field is missing or out of range.
	ErrConfig = errors.New("connector: invalid config")
	// ErrGeneration: a weights generation that is not newer than one
	// already in use: a Rotate to the current or an older generation, or
	// Metadata older than a worker has already seen.
	ErrGeneration = errors.New("connector: generation not newer")
)
