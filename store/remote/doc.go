// Package remote serves a [store.Store] to other processes over a stream
// socket, and gives them a client that is itself a store.Store.
//
// It is for engines whose workers are separate processes (one per
// tensor-parallel rank, say) that must all reach the embedded store
// (store/memstore) living in the engine's scheduler process. The
// scheduler process runs a [Server] of its store on a unix socket (or on
// TCP, with a shared secret: see "Security"); each worker process calls
// [Dial] and uses the [Client] as it would use the store.
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
// Over TCP both sides need the same shared secret (see "Security"), here
// from the environment variable KVCONNECT_REMOTE_SECRET of both processes
// or given in the options:
//
//	srv, err := remote.NewServer(s, remote.ServerOptions{Secret: secret})
//	l, err := remote.Listen("tcp", "10.0.0.5:7070")
//	go srv.Serve(l)
//	...
//	c, err := remote.Dial(ctx, "tcp", "10.0.0.5:7070", remote.ClientOptions{Secret: secret})
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
// for a second between frames, and when it ends, which a frame that
// stalls for [ServerOptions.FrameTimeout] makes it do: at most
// [ServerOptions.MaxConns] × MaxCallBytes in all), and calls the store's
// Put and Get on it: one copy
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
// # Security
//
// Whom the server trusts: a peer that proves the shared secret, or, on a
// unix socket made by [Listen] without a secret, any process of the
// socket's owner (the socket has mode 0600, and Listen never exposes it
// wider). Every other peer is refused before it can make a call.
//
// What is authenticated: with a secret ([ServerOptions.Secret],
// [ClientOptions.Secret], or the environment variable [SecretEnv] on
// either side; at least [MinSecretLen] bytes), each connection starts
// with a mutual challenge-response: both sides draw a fresh 32-byte nonce,
// the server proves the secret with HMAC-SHA256 over a server label and
// both nonces, the client checks that proof and answers with its own
// over a client label. The secret never crosses the wire, a recorded
// handshake proves nothing on a new connection (the other side's nonce
// differs), and a client refuses a server that proves a different secret,
// or none when the client has one. A wrong secret fails Dial with an error
// that says so, and the server logs a warning and closes the connection;
// the secret itself is never logged nor put in an error text ([Secret]
// prints as "[secret]"). A server refuses to Serve a listener of any
// network but "unix" without a secret, and Dial refuses to dial one.
//
// What is not: nothing is encrypted, and the frames after the handshake
// are not authenticated one by one (their CRC-32C guards against
// accidents, not against a party on the path). Someone who can read the
// traffic reads the values; someone who can change it in flight (a
// machine on the path, not a mere peer) can change them. Keep TCP on a
// network you trust, or tunnel it (SSH, WireGuard, a TLS proxy); the
// shared secret keeps out peers that merely reach the port, not the
// network. Authentication says nothing of what a client may do: any
// client that holds the secret may read, write and remove every key.
//
// Bounds on a peer, before and after it is trusted: a connection must send
// its hello, and its proof, within [ServerOptions.HelloTimeout] (default
// 5 s), so silent connections cannot hold the [ServerOptions.MaxConns]
// places (default 64) for long; a connection refused for MaxConns is
// answered and closed within HelloTimeout too, and at most MaxConns are
// being refused at once: beyond that, a connection is closed unanswered,
// so a flood of connections keeps at most 2 × MaxConns of them open, and
// each for HelloTimeout at most until it has sent its hello. Once a frame
// has begun, each MiB of it, read or written, must move within
// [ServerOptions.FrameTimeout] (default 5 s), or the connection ends and
// its staging memory is freed: a put that stops after its header and a
// reply the client never reads hold it that long at most (a trusted peer
// that trickles a MiB per FrameTimeout keeps its connection). Between
// frames a connection may stay idle, and holds no staging memory once
// idle for a second. A frame's body is
// at most what [ServerOptions.MaxBatch] keys take, its values at most
// [ServerOptions.MaxCallBytes], each value at most [ServerOptions.MaxValue];
// a watch holds at most [ServerOptions.MaxWatch] events on the server. The
// client bounds every reply by the server's declared limits, and a call by
// [ClientOptions.CallTimeout].
//
// # Key events
//
// A Client implements [store.Watcher] exactly when the served store does,
// as the server declares when a connection starts ([Limits].Watcher).
// Each Watch opens a connection of its own to the server, which keeps a
// feed of the store for it (of the smaller of n and ServerOptions.MaxWatch
// events) and sends what the feed holds every 10 ms, with the count of the
// events it dropped, which the client's feed adds to its own: the reader
// learns of every drop. A connection that breaks counts one event lost
// (how many were, nobody can know: the reader must resynchronise) and is
// made again, after a pause that doubles from 100 ms to 5 s while dials
// fail. Closing the feed ends its connection within a second; Close of
// the Client closes every feed. A served store closed under a watch stops
// adding to it; the client's feed is not told.
//
// # Stats and leases
//
// Client.Stats returns the served store's counters, fetched from the
// server. A Client implements [store.Leaser] exactly when the served store
// does, with the server's declaration, [store.Watcher] likewise (see "Key
// events"), and [store.Vectored] always (the
// server stages the value whole, whether or not its store is Vectored).
//
// # Concurrency
//
// A Server and a Client are safe for concurrent use. A Client runs up to
// [ClientOptions.Conns] calls at once, one connection each; a Server
// serves up to [ServerOptions.MaxConns] connections, each with goroutines
// of its own, one call at a time per connection, and refuses more; each
// watch takes one connection, and a goroutine of the Client.
// Server.Close closes every listener and connection and waits for the
// goroutines; Client.Close waits for the calls running, and ends the
// watches and waits for their goroutines.
// Neither closes the served store.
package remote
