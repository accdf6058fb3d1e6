package scheduler

import (
	"fmt"
	"slices"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// Request is what the engine adds: a prompt and the extra keys that change
// what its blocks mean (adapter, cache salt, multimodal items).
type Request struct {
	// ID names the request until it ends and its blocks are released; it
	// may then be used again. Required.
	ID connector.RequestID
	// Prompt is the prompt's tokens, at least one. The scheduler copies it.
	Prompt []hashing.Token
	// Extras are the request's extra keys, hashed into every block hash
	// (see [hashing.NewChain]).
	Extras []hashing.Extra
	// MaxTokens, when > 0, is how many tokens the engine may generate at
	// most: the scheduler reserves room for them in its token and block
	// tables once, so that decoding does not grow them. It does not end
	// the request: the engine does, with [Result].Finished.
	MaxTokens int
	// TransferParams are the transfer parameters the request arrived with
	// (from the connector of the instance that ran its prefill), handed to
	// the connector as connector.Request.TransferParams. The scheduler
	// copies them.
	TransferParams []byte
}

// State is where a request is in its lifecycle:
//
//	Waiting ──▶ LookupPending ──▶ Waiting
//	Waiting ──▶ Loading ──▶ Running            (external KV loaded)
//	            Loading ──▶ Running            (load failed: roll back, recompute)
//	            Loading ──▶ Failed             (load failed, policy fail)
//	Waiting ──▶ Running ──▶ Finished
//	Running, Loading ──▶ Preempted ──▶ Waiting (once the connector releases its blocks)
//	any but Finished, Failed ──▶ Aborted
type State uint8

const (
	// Waiting: queued, holding no blocks.
	Waiting State = iota + 1
	// LookupPending: queued; the connector's lookup of its external KV is
	// still running. It does not hold up the requests behind it.
	LookupPending
	// Loading: admitted with external KV; its blocks are allocated and the
	// connector loads into them. It does not run until the load ends.
	Loading
	// Running: computing its prefill, chunk by chunk, or decoding.
	Running
	// Preempted: evicted for blocks or by Invalidate. Its blocks are freed
	// when no transfer touches them; it then waits again, first in line
	// among newer requests, and recomputes what the caches lack.
	Preempted
	// Finished: ended by the engine (Result.Finished).
	Finished
	// Failed: ended by a failure: a load failure under the fail policy, a
	// connector error, or growing larger than the pool.
	Failed
	// Aborted: ended by Abort.
	Aborted
)

func (s State) String() string {
	switch s {
	case Waiting:
		return "waiting"
	case LookupPending:
		return "lookup-pending"
	case Loading:
		return "loading"
	case Running:
		return "running"
	case Preempted:
		return "preempted"
	case Finished:
		return "finished"
	case Failed:
		return "failed"
	case Aborted:
		return "aborted"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Ended reports whether s is final: Finished, Failed or Aborted.
func (s State) Ended() bool { return s >= Finished }

// Metrics are one request's counters: where its tokens came from and when
// its first token came. Step indices count Step calls from 1.
type Metrics struct {
	Added      uint64 // steps planned before Add: its first chance to run is step Added+1
	FirstToken uint64 // the step whose Done carried its first sampled token; 0 before
	EndStep    uint64 // the step in which it ended; 0 before

	LocalTokens    int // tokens found in the local prefix cache, summed over admissions
	ExternalTokens int // tokens loaded through the connector (valid ones only)
	ComputedTokens int // tokens computed, prefill and decode, recomputation included
	Generated      int // tokens sampled
	Preemptions    int // times preempted (blocks or Invalidate)
	LoadFailures   int // loads that failed in part or whole
}

// Status is a snapshot of one request.
type Status struct {
	State    State
	Tokens   int  // tokens known: prompt and generated
	Computed int  // tokens whose KV is in its blocks
	Blocks   int  // blocks it holds, in every KV cache group
	Held     bool // its blocks wait for the connector's release
	Metrics  Metrics
}

// Ended is a request that ended, as [Scheduler.TakeEnded] reports it.
type Ended struct {
	ID      connector.RequestID
	State   State // Finished, Failed or Aborted
	Err     error // why it failed; nil otherwise
	Metrics Metrics
}

// request is the scheduler's record of one request.
type request struct {
	id     connector.RequestID
	seq    uint64 // arrival order: lower is older
	state  State
	tokens []hashing.Token
	chain  *hashing.Chain
	plain  bool              // chain has no extras: reusable by any request without extras
	creq   connector.Request // the connector's view; Hashes is chain.Hashes()
	// tabs[g] is the block table of KV cache group g: tabs[g][i] holds
	// block i of the group (tokens [i*B, (i+1)*B), or for a state group
	// the state after them), or connector.NoBlock.
	tabs [][]BlockID
	gs   []reqGroup  // per group, what the table alone does not say
	view [][]BlockID // the connector's view of tabs: see tables

	computed  int  // tokens whose KV is in the tables
	committed int  // leading blocks indexed in (or taken from) the prefix cache, in every group
	local     int  // tokens of the local hit at the last admission
	external  int  // tokens being loaded (Loading, or inline)
	inline    bool // Running in the step of its load (Config.LayerwiseLoads): its result counts once the load is done
	discard   bool // Done: the step's work for it is void (its inline load failed); rollBack takes it to valid
	failLoad  bool // with discard: the load failed under PolicyFail
	valid     int  // with discard: the tokens of KV that survived
	awaitLoad bool // with discard: no Output reported the load's end: the request waits for it (Loading)
	known     bool // the connector knows it (Match or Scheduled was called)
	held      bool // Finish said keep: blocks wait for Progress.Released
	exclusive int  // blocks counted in Scheduler.pendingFree while held
	err       error
	m         Metrics

	planned uint64 // the step whose plan holds it
	item    int    // its index in that plan's Items
	seen    uint64 // Done validation epoch in which a result named it
}

// reqGroup is a request's state in one KV cache group beyond its table.
type reqGroup struct {
	refs    int       // blocks it holds: table entries and retired
	retired []BlockID // blocks out of the table, held until the request's blocks are released
	// For a sliding-window group: shown is the table as the connector sees
	// it (see Scheduler.hide), named the length of the table the
	// connector was last handed, hidden the entries below which hide
	// looked, low the entries below which the table is out of the window.
	shown              []BlockID
	named, hidden, low int
	exclusive          int // of refs, the blocks only it holds, while held
}

func (r *request) hashes() []hashing.BlockHash { return r.creq.Hashes }

// queue is a list of requests kept in arrival order.
type queue []*request

func (q queue) find(r *request) int {
	i, ok := slices.BinarySearchFunc(q, r.seq, func(x *request, seq uint64) int {
		switch {
		case x.seq < seq:
			return -1
		case x.seq > seq:
			return 1
		}
		return 0
	})
	if !ok {
		return -1
	}
	return i
}

func (q *queue) insert(r *request) {
	s := *q
	i := len(s)
	for i > 0 && s[i-1].seq > r.seq {
		i--
	}
	*q = slices.Insert(s, i, r)
}

func (q *queue) remove(r *request) bool {
	i := q.find(r)
	if i < 0 {
		return false
	}
	s := *q
	copy(s[i:], s[i+1:])
	s[len(s)-1] = nil
	*q = s[:len(s)-1]
	return true
}

// tables returns r's block tables as the connector takes them, one per
// group, in space r owns, so that passing them (tables()...) through the
// connector's interface does not allocate. A sliding-window group's table
// is its shown view; the others are the tables themselves.
func (r *request) tables() [][]BlockID {
	for g := range r.view {
		if r.gs[g].shown != nil {
			r.view[g] = r.gs[g].shown
		} else {
			r.view[g] = r.tabs[g]
		}
	}
	return r.view
}

// blocks returns how many blocks r holds, in every group.
func (r *request) blocks() int {
	n := 0
	for g := range r.gs {
		n += r.gs[g].refs
	}
	return n
}
