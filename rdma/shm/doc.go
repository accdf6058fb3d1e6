// Package shm is a transfer engine ([rdma.Engine]) for processes of one
// user on one Linux host: the prefill and decode engines of a host, or an
// engine and a store server beside it, move KV-cache blocks through shared
// memory with one memmove per request and no staging copy.
//
// An [Engine]'s segment is the memory registered with it, which must lie
// in [Memory] from [Engine.Alloc]: an anonymous memory file (memfd) mapped
// shared. A peer that opens the segment maps the files it reaches into its
// own address space, and a request is a memmove by the engine that
// submits it between its registered memory and that mapping: reads and
// writes alike, the owner of the remote memory never copies. Remote
// addresses are the owner's own (those of its Memory), exchanged out of
// band as for every rdma.Engine; the peer translates them.
//
// # How a peer finds the memory
//
// An engine listens on an abstract Unix socket named by its segment name
// ([Options.Name]; by default from its process id and 128 random bits).
// A peer's [Engine.Open] connects to it; each side checks with
// SO_PEERCRED that the other runs as the same user and drops the
// connection otherwise. Before each group of requests the peer asks the
// owner over the socket to grant their remote ranges: the owner checks
// that each lies in memory it has registered, holds it registered until
// the peer releases the grant, and says which memory file and offset it
// is. The owner passes a memory file once per connection, as a file
// descriptor over the socket (SCM_RIGHTS); the peer maps it and closes
// the descriptor.
//
// Passing descriptors is the choice over opening /proc/<pid>/fd/<n>,
// which also works for one user: it needs no ptrace access to the owner
// (denied under hardened settings, hidepid mounts and in many
// containers), it hands the file only to a peer the owner checked, and a
// peer cannot reach memory the owner never registered. Abstract sockets
// and memory files have no name in any file system, so nothing is left
// behind when a process dies, even by SIGKILL: the kernel removes the
// socket with its last descriptor, and a memory file with its last
// descriptor and mapping (a peer that finds its owner gone unmaps the
// owner's memory at once). The memory files have mode 0600 and are
// sealed against shrinking and growing, so no other user can open them
// through /proc and a peer's mapping can never fault.
//
// # Usage
//
//	e, err := shm.New(nil)
//	if err != nil {
//		return err // wraps shm.ErrUnsupported off Linux
//	}
//	kv, err := e.Alloc(64 << 20) // the KV memory, shared
//	...
//	err = e.Register(kv.Region())
//	...
//	// At the end: Close (or Unregister) first, then Free: registered
//	// memory is not freed.
//	// Tell peers e.Segment() and kv.Region().Addr (out of band).
//
// In the peer process, with its own engine p and registered memory:
//
//	seg, err := p.Open(ctx, name)
//	b, err := p.NewBatch(n)
//	err = b.Submit([]rdma.Request{{Op: rdma.Read, Local: blk, Segment: seg, Remote: addr}})
//	err = b.Wait(ctx)
//
// # Limits
//
// Peers must share the host, the user and the network namespace (where
// abstract sockets live). Host memory only: device memory is refused with
// an error wrapping [ErrUnsupported]. A peer keeps its mapping of a
// Memory the owner freed until it closes the segment. A peer stopped
// (SIGSTOP) while it holds a grant delays the owner's Unregister and
// Close until it runs again or dies.
//
// # Platforms
//
// Linux only (memfd_create, Linux 3.17 or later, through package syscall).
// Elsewhere [New] and every method return errors wrapping [ErrUnsupported].
//
// # Concurrency
//
// An Engine, its batches and its Memory are safe for concurrent use. An
// engine owns its goroutines (Options.Workers copies, a listener, one per
// connected peer) and joins them in Close. The bytes themselves are not
// synchronised: as with every engine, callers keep memory out of use
// while a request that reaches it is pending.
package shm
