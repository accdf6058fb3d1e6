// Package remote serves a [store.Store] to other processes over a stream
// socket, and gives them a client that is itself a store.Store.
//
// It is for engines whose workers are separate processes (one per
// tensor-parallel rank, say) that must all reach the embedded store
// (store/memstore) living in the engine's scheduler process. The
// scheduler process runs a [Server] of its store on a unix socket (or on
// TCP, on 127.0.0.1); each worker process calls [Dial] and uses the
// [Client] as it would use the store.
//
// # Usage
//
// In the process that holds the store:
//
//	srv, err := remote.NewServer(s, remote.ServerOptions{})
//	if err != nil { ... }
//	l, err := remote.Listen("unix", "/run/user/1000/kv.sock") // mode 0600
//	if err != nil { ... }
//	go srv.Serve(l) // returns remote.ErrServerClosed after Close
//	defer srv.Close()
//
// In every other process:
//
//	c, err := remote.Dial(ctx, "unix", "/run/user/1000/kv.sock", remote.ClientOptions{})
//	if err != nil { ... }
//	defer c.Close()
//	if err := c.Register(kv.Region()); err != nil { ... }
//	err = c.Put(ctx, keys, srcs, res)
//	err = c.Get(ctx, keys, dsts, res)
//
// # Data path
//
// Values never pass through Go-heap buffers on the client: Put writes the
// bytes of the caller's regions straight into the socket (one vectored
// write per request), and Get reads them from the socket straight into the
// destination regions. The client therefore takes only memory it was given
// with Register, whatever the served store does. The server stages values
// in host memory of each connection, mapped outside the Go heap and
// registered with the served store (grown on demand up to
// [ServerOptions.MaxCallBytes], freed once the connection has been idle
// for a second, and when it ends: at most [ServerOptions.MaxConns] ×
// MaxCallBytes in all), and calls the store's Put and Get on it: one copy
// between socket and staging memory, and the store's own copy. A get reply carries the results first
// and then the values, so the client writes exactly a value's bytes into
// its destination, and nothing into one the server found too short (the
// client sends the destinations' lengths). Batches larger than the
// server's limits ([Limits]) are split into several requests.
//
// # Integrity and failure
//
// Every frame carries a CRC-32C over its header, its fields and its value
// bytes (the format is written out in wire.go). The server stores the
// values of a put only once the whole frame has arrived and its checksum
// matches, so a client killed mid-put, or a corrupted frame, stores
// nothing. A get reply whose checksum fails reports every key of its
// request failed with store.ErrTransfer.
//
// A call whose connection breaks (the server closed or killed) reports
// every key not yet answered failed with an error wrapping
// store.ErrTransfer; the connection is dropped, and so are the idle ones,
// and later calls dial again, so a server that comes back on the same
// address is used again. A server that does not answer within
// [ClientOptions.CallTimeout] fails the request the same way. A context
// that ends while the server runs a call is sent to the server, which
// cancels the store's call and answers with what it did (so RemovePrefix
// counts exactly what it removed); a context that ends in the middle of a
// frame drops the connection, and the keys not answered report the
// context's error.
//
// Per-key and whole-call errors cross the wire as codes, one per sentinel
// of package store, with the server's message: errors.Is matches them on
// the client as on the server. What can be checked locally (keys, the
// batch's slices, regions, a value larger than the server's MaxValue) is
// checked by the client, without a round trip.
//
// The protocol has no authentication: a unix socket made by [Listen] is
// reachable by its owner only; a TCP listener should be bound to the
// loopback address.
//
// # Stats and leases
//
// Client.Stats returns the served store's counters, fetched from the
// server. A Client implements [store.Leaser] exactly when the served store
// does, with the server's declaration, and [store.Vectored] always (the
// server stages the value whole, whether or not its store is Vectored).
//
// # Concurrency
//
// A Server and a Client are safe for concurrent use. A Client runs up to
// [ClientOptions.Conns] calls at once, one connection each; a Server
// serves up to [ServerOptions.MaxConns] connections, each with goroutines
// of its own, one call at a time per connection, and refuses more.
// Server.Close closes every listener and connection and waits for the
// goroutines; Client.Close waits for the calls running.
// Neither closes the served store.
package remote
