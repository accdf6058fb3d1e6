package remote

// Endings is the tests' slog.Handler of connection ends (endings), for
// the package's external tests too.
type Endings = endings

// Staged returns the bytes of staging memory srv holds now, over all its
// connections.
func Staged(srv *Server) int64 { return srv.staged.Load() }
