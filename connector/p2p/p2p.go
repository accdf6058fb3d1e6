package p2p

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
)

// Name is the name the connector registers under, for kv_connector.
const Name = "P2PConnector"

func init() { connector.Register(Name, registered{}) }

// driver is the registry's entry. The halves it opens are linked in
// process, as New links them: OpenPlanner opens the scheduler half under
// the config's engine_id, and OpenWorker, given the rank's transfer engine
// in Env.Engine or opening the one kv_connector_extra_config "transfer"
// names, joins the scheduler half of the same engine_id, which must be
// open in this process. Closing the scheduler half frees the engine_id.
type registered struct{}

// opened holds the scheduler halves the registry opened, by engine_id.
var opened struct {
	sync.Mutex
	m      map[string]*Planner
	fabric *rdma.Fabric // the loopback engines' ("transfer": "loopback"), from first use
}

func (registered) OpenPlanner(cfg connector.Config, env connector.Env) (connector.Planner, error) {
	opt, err := parseOptions(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.EngineID == "" {
		return nil, fmt.Errorf("%w: %s: engine_id is empty: opened by name, the worker halves find their scheduler half by it", connector.ErrConfig, Name)
	}
	ns, err := env.Identity.Namespace()
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	if err := checkGroups(ns); err != nil {
		return nil, err
	}
	opened.Lock()
	defer opened.Unlock()
	if _, dup := opened.m[cfg.EngineID]; dup {
		return nil, fmt.Errorf("%w: %s: a scheduler half of engine_id %q is already open in this process", connector.ErrConfig, Name, cfg.EngineID)
	}
	tp := env.Identity.Layout.TPSize
	b := &board{ranks: make([]*Rank, tp)}
	s := newScheduler(cfg, opt, env.Identity, ns, logger(env), b)
	id := cfg.EngineID
	s.onClose = func() {
		opened.Lock()
		if opened.m[id] == s {
			delete(opened.m, id)
		}
		opened.Unlock()
	}
	if opened.m == nil {
		opened.m = make(map[string]*Planner)
	}
	opened.m[id] = s
	return s, nil
}

func (registered) OpenWorker(cfg connector.Config, env connector.Env) (connector.Worker, error) {
	opt, err := parseOptions(cfg)
	if err != nil {
		return nil, err
	}
	switch {
	case env.Engine == nil && opt.transfer == "":
		return nil, fmt.Errorf("%w: %s moves blocks with an rdma.Engine: set Env.Engine to this rank's, or kv_connector_extra_config.transfer to %q, %q or %q", connector.ErrConfig, Name, TransferLoopback, TransferShm, TransferMooncake)
	case env.Engine != nil && opt.transfer != "":
		return nil, fmt.Errorf("%w: %s: Env.Engine is set and kv_connector_extra_config.transfer = %q: give the engine one way", connector.ErrConfig, Name, opt.transfer)
	}
	ns, err := env.Identity.Namespace()
	if err != nil {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	opened.Lock()
	s := opened.m[cfg.EngineID]
	opened.Unlock()
	switch {
	case s == nil:
		return nil, fmt.Errorf("%w: %s: no scheduler half of engine_id %q is open in this process: open it first (the halves are linked in process)", connector.ErrConfig, Name, cfg.EngineID)
	case s.ns != ns:
		return nil, fmt.Errorf("%w: %s: Env.Identity is not the identity of the scheduler half of engine_id %q (namespace %s, want %s)", connector.ErrConfig, Name, cfg.EngineID, ns, s.ns)
	}
	if tp := env.Identity.Layout.TPSize; env.Rank < 0 || env.Rank >= tp {
		return nil, fmt.Errorf("%w: Env.Rank = %d, want [0, %d) for TP size %d", connector.ErrConfig, env.Rank, tp, tp)
	}
	if env.Engine != nil {
		return newWorker(cfg, opt, env.Rank, env.Engine, env.Identity.Generation, logger(env), s.board), nil
	}
	e, err := openTransfer(opt.transfer, cfg.EngineID, env.Rank, logger(env), opt.openTimeout)
	if err != nil {
		return nil, err
	}
	w := newWorker(cfg, opt, env.Rank, e, env.Identity.Generation, logger(env), s.board)
	w.owned = true
	return w, nil
}

// checkGroups refuses a layout of KV cache groups other than one of full
// attention: this connector moves each request's one block table.
func checkGroups(ns hashing.Namespace) error {
	if gs := ns.Groups(); len(gs) != 1 || gs[0].Kind != hashing.FullAttention {
		return fmt.Errorf("%w: %s moves the blocks of one full-attention KV cache group; the identity's layout has %d groups (Layout.Groups): use %s's store connector for hybrid models", connector.ErrConfig, Name, len(gs), "connector/storeconn")
	}
	return nil
}

func logger(env connector.Env) *slog.Logger {
	if env.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return env.Logger
}

// options are the connector's settings, from kv_connector_extra_config.
type options struct {
	keepTimeout  time.Duration // "keep_timeout": how long a producer keeps an offer's blocks
	slots        int           // "mailbox_slots": offers a producer worker can hold at once
	openTimeout  time.Duration // "open_timeout": bound on opening a producer's segment
	closeTimeout time.Duration // "close_timeout": bound on a worker's Close waiting for transfers to settle
	verify       bool          // "verify": check each block read against the producer's CRC-32
	transfer     string        // "transfer": the engine a worker opened by name opens, "" for Env.Engine's
}

// extraKeys are the kv_connector_extra_config keys the connector reads;
// any other key is an error.
var extraKeys = []string{"close_timeout", "keep_timeout", "mailbox_slots", "open_timeout", "transfer", "verify"}

func parseOptions(cfg connector.Config) (options, error) {
	var o options
	if err := cfg.CheckExtra(extraKeys...); err != nil {
		return o, err
	}
	var err error
	if o.keepTimeout, err = cfg.ExtraDuration("keep_timeout", 120*time.Second); err != nil {
		return o, err
	}
	if o.keepTimeout <= 0 {
		return o, fmt.Errorf("%w: kv_connector_extra_config.keep_timeout = %v, want > 0", connector.ErrConfig, o.keepTimeout)
	}
	if o.openTimeout, err = cfg.ExtraDuration("open_timeout", 10*time.Second); err != nil {
		return o, err
	}
	if o.openTimeout <= 0 {
		return o, fmt.Errorf("%w: kv_connector_extra_config.open_timeout = %v, want > 0", connector.ErrConfig, o.openTimeout)
	}
	if o.closeTimeout, err = cfg.ExtraDuration("close_timeout", 30*time.Second); err != nil {
		return o, err
	}
	if o.closeTimeout <= 0 {
		return o, fmt.Errorf("%w: kv_connector_extra_config.close_timeout = %v, want > 0", connector.ErrConfig, o.closeTimeout)
	}
	v, err := cfg.ExtraChoice("verify", "checksum", "checksum", "none")
	if err != nil {
		return o, err
	}
	o.verify = v == "checksum"
	if o.transfer, err = cfg.ExtraString("transfer", ""); err != nil {
		return o, err
	}
	if o.transfer != "" {
		if _, err := cfg.ExtraChoice("transfer", "", transfers...); err != nil {
			return o, err
		}
	}
	if o.slots, err = cfg.ExtraInt("mailbox_slots", 1024); err != nil {
		return o, err
	}
	if o.slots < 1 || o.slots > maxSlots {
		return o, fmt.Errorf("%w: kv_connector_extra_config.mailbox_slots = %d, want 1 to %d", connector.ErrConfig, o.slots, maxSlots)
	}
	return o, nil
}

// New opens the two halves of the P2P connector for one engine instance:
// the scheduler half and one worker half per transfer engine, engines[i]
// serving tensor-parallel rank i (there must be env.Identity.Layout.TPSize
// of them). The halves are linked in process: each worker hands the
// scheduler half its memory when it registers, and the scheduler half
// hands its offers to the workers as it makes them, to arm at once. A
// consumer's loads need no link: each carries the producer's transfer
// parameters in the Metadata (Transfer.Params). The connector does not
// close the engines.
//
// A producer (kv_producer, or kv_both) offers the full blocks of each
// request that ends ([Planner.Finish] keeps them) and returns their
// transfer parameters ([Planner.TransferParams]); a consumer
// (kv_consumer, or kv_both) takes parameters for a request
// ([Planner.SetParams]) before its first Match.
func New(cfg connector.Config, env connector.Env, engines ...rdma.Engine) (*Planner, []*Worker, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	opt, err := parseOptions(cfg)
	if err != nil {
		return nil, nil, err
	}
	if opt.transfer != "" {
		return nil, nil, fmt.Errorf("%w: p2p.New: kv_connector_extra_config.transfer = %q: New takes its transfer engines as arguments; transfer is for workers opened by name", connector.ErrConfig, opt.transfer)
	}
	ns, err := env.Identity.Namespace()
	if err != nil {
		return nil, nil, fmt.Errorf("p2p: identity: %w", err)
	}
	if err := checkGroups(ns); err != nil {
		return nil, nil, err
	}
	tp := env.Identity.Layout.TPSize
	if len(engines) != tp {
		return nil, nil, fmt.Errorf("%w: p2p.New: %d engines for tp_size %d: want one per rank", connector.ErrConfig, len(engines), tp)
	}
	for i, e := range engines {
		if e == nil {
			return nil, nil, fmt.Errorf("%w: p2p.New: engine %d is nil", connector.ErrConfig, i)
		}
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &board{ranks: make([]*Rank, tp)}
	s := newScheduler(cfg, opt, env.Identity, ns, log, b)
	ws := make([]*Worker, tp)
	for i, e := range engines {
		ws[i] = newWorker(cfg, opt, i, e, env.Identity.Generation, log, b)
	}
	return s, ws, nil
}

// board links the halves of one New in a producer: the workers' memory
// for the scheduler half (the workers of another process hand it over
// with Handshake and SetHandshake), and the offers for the workers to arm
// as they are made (the workers of another process arm them from the
// Metadata). A consumer needs none of it: its loads carry everything in
// the Metadata.
type board struct {
	mu      sync.Mutex
	ranks   []*Rank   // per rank, once its worker registered
	workers []*Worker // per rank, the worker of this process that registered, if any
	slots   int       // the scheduler half's mailbox_slots: every rank's must be the same
}

// loadPlan is the producer's side of one load, from the parameters the
// load carries.
type loadPlan struct {
	params Params              // the producer's parameters
	remote []connector.BlockID // the producer's blocks, in the order of the transfer's blocks
	notify bool                // no blocks to read: only tell the producer
}

// slotCount returns the scheduler half's mailbox_slots, 0 before it opened.
func (b *board) slotCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.slots
}

func (b *board) setRank(rank int, r Rank) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ranks[rank] = &r
}

// join records w, registered in this process, as the worker of rank, for
// handOn.
func (b *board) join(rank int, w *Worker, r Rank) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ranks[rank] = &r
	if b.workers == nil {
		b.workers = make([]*Worker, len(b.ranks))
	}
	b.workers[rank] = w
}

// leave forgets w, which closed.
func (b *board) leave(rank int, w *Worker) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.workers != nil && b.workers[rank] == w {
		b.workers[rank] = nil
	}
}

// handOn hands offer t to the workers of this process, which arm it at
// once, without waiting for the Metadata that carries it; they then skip
// it there. Workers of other processes arm it when they start that
// Metadata.
func (b *board) handOn(t connector.Transfer) {
	b.mu.Lock()
	ws := slices.Clone(b.workers)
	b.mu.Unlock()
	for _, w := range ws {
		if w != nil {
			w.handOn(t)
		}
	}
}

// handshake returns every rank's memory, or false while one is missing.
func (b *board) handshake() ([]Rank, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Rank, len(b.ranks))
	for i, r := range b.ranks {
		if r == nil {
			return nil, false
		}
		out[i] = *r
	}
	return out, true
}

// The mailbox's layout (see the package documentation, "The mailbox"): a
// header, then the slots. The header is the magic, then the mailbox seal
// of the worker's Rank; a slot is the offer word, the done word, then the
// offer seal of the offer it holds (written before the offer is armed).
const (
	headerBytes = 64
	slotBytes   = 64
	sealAt      = 16 // a slot's offer seal
)

// mailboxMagic opens a mailbox header.
var mailboxMagic = [8]byte{'K', 'V', 'm', 'b', 'o', 'x', 0, paramsVersion}

// slotAddr returns the address of slot i of the mailbox at mailbox.
func slotAddr(mailbox uint64, i int) uintptr {
	return uintptr(mailbox) + headerBytes + uintptr(i)*slotBytes
}

// Offer words. An offer word holds 0 (never used), or an offer ID shifted
// left by two with the offer's state in the low bits: 1 armed, 2 ended.
// Offer IDs are below 2^62.
func armed(offer uint64) uint64 { return offer<<2 | 1 }
func ended(offer uint64) uint64 { return offer<<2 | 2 }

// namespaceOf returns the namespace string parameters carry.
func namespaceOf(ns hashing.Namespace) string { return ns.String() }
