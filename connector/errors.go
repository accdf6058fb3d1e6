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
	// ErrBadMetadata: Metadata or Output bytes do not decode (a wrong
	// magic, another wire version, a truncated or extended frame, a
	// checksum mismatch, a malformed body), a value cannot be encoded,
	// or a worker is handed a Metadata it cannot carry out.
	ErrBadMetadata = errors.New("connector: malformed metadata")
	// ErrConfig: a Config field is missing or out of range.
	ErrConfig = errors.New("connector: invalid config")
	// ErrGeneration: a rotation or a Metadata names a weights generation
	// that is not newer than one already in force. Generations only move
	// forward: going back would serve KV of weights that were replaced.
	ErrGeneration = errors.New("connector: generation not newer")
	// ErrLayer: a layer index out of range, or a layer waited on or saved
	// again or out of order ([LayerWorker]).
	ErrLayer = errors.New("connector: invalid layer")
)
