package remote

// Endings is the tests' slog.Handler of connection ends (endings), for
// the package's external tests too.
type Endings = endings
