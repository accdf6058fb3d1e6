package main

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// Workload is N concurrent multi-turn sessions: each turn's prompt is a
// system prompt shared by every session, the session's history (earlier
// prompts and answers), and new user tokens.
type Workload struct {
	Sessions  int    // concurrent sessions
	System    int    // tokens of the system prompt every session shares
	FirstTurn int    // user tokens of the first turn
	Growth    int    // user tokens added by each later turn
	Output    int    // tokens generated per turn
	Turns     int    // turns per session
	Seed      uint64 // draws the tokens
}

// maxContext returns the longest context a request reaches, in tokens.
func (w Workload) maxContext() int {
	return w.System + w.FirstTurn + (w.Turns-1)*(w.Growth+w.Output) + w.Output
}

// userTokens returns the user tokens of a session's turn.
func (w Workload) userTokens(session, turn, vocab int) []hashing.Token {
	n := w.Growth
	if turn == 0 {
		n = w.FirstTurn
	}
	r := splitmix(w.Seed ^ uint64(session+1)*0x9e3779b97f4a7c15 ^ uint64(turn+1)*0xbf58476d1ce4e5b9)
	out := make([]hashing.Token, n)
	for i := range out {
		out[i] = hashing.Token(r.next() % uint64(vocab))
	}
	return out
}

func (w Workload) system(vocab int) []hashing.Token {
	r := splitmix(w.Seed ^ 0x5eed)
	out := make([]hashing.Token, w.System)
	for i := range out {
		out[i] = hashing.Token(r.next() % uint64(vocab))
	}
	return out
}

// turnKey names one turn of one session.
type turnKey struct{ Session, Turn int }

// Stats are one run's measurements.
type Stats struct {
	Succeeded, Failed int
	Duration          time.Duration
	PromptTokens      int
	OutputTokens      int
	LocalTokens       int
	ExternalTokens    int
	ComputedTokens    int
	TTFT, TPOT        time.Duration // means
	Latency           time.Duration // mean time from a request's submission to its end
	LaterTTFT         time.Duration // mean TTFT of turns after the first
	Steps             int
	IdleSteps         int   // steps that computed nothing
	ConnLoads         int64 // blocks loaded by the connector
	ConnLoadBytes     int64 // bytes loaded
	ConnSaves         int64 // blocks saved
	ConnFailures      int64 // blocks whose transfer failed
	ConnCorrupt       int64 // loaded blocks that failed verification (also in ConnFailures)
	ConnNanos         int64 // time the connector spent in lookups and transfers
	ConnLookupNanos   int64 // of which lookups: on the engine's goroutine with "lookup": "sync"
	ConnLookups       int64 // lookups (one batch exists each)
	InlineLoads       int64 // loads run in the step that computed their request (-layerwise)
	DiscardedSteps    int64 // of which the step's work was discarded
	outputs           map[turnKey][]hashing.Token
	prompts           map[turnKey][]hashing.Token
	gens              map[turnKey]uint64 // the weights generation a turn was submitted under

	// ConnLoadTokens are the tokens loaded, by the medium of the store
	// tier that served them (-store tiered).
	ConnLoadTokens tierTokens
}

// HitRate returns the share of prompt tokens served from a cache.
func (s Stats) HitRate(tokens int) float64 {
	if s.PromptTokens == 0 {
		return 0
	}
	return float64(tokens) / float64(s.PromptTokens)
}

// router says which engine serves a turn.
type router func(session, turn int) int

// hooks let a scenario act between steps.
type hooks struct {
	// onEnd is called after every request that ends, with the number
	// ended so far.
	onEnd func(ended int) error
	// wait, when set, blocks while every engine is idle (Engine.Idle)
	// until one of their connectors has news, instead of stepping.
	wait bool
	// prefill, when set, runs each turn's prefill first (generating one
	// token), and hands the request on to the routed engine with the
	// transfer parameters prefill's connector returns: disaggregated
	// prefill and decode. TTFT counts from the prefill's submission.
	prefill *Engine
}

// run drives the workload through the engines until every turn ended, and
// returns the measurements.
func run(ctx context.Context, engines []*Engine, w Workload, route router, h hooks, progress func(done, total int)) (Stats, error) {
	vocab := engines[0].cfg.vocab()
	sys := w.system(vocab)
	history := make([][]hashing.Token, w.Sessions)
	done := make(chan finished, w.Sessions*w.Turns)
	prefilled := make(chan finished, w.Sessions*w.Turns)
	turnOf := map[connector.RequestID]turnKey{}
	added := map[turnKey]time.Time{}
	st := Stats{outputs: map[turnKey][]hashing.Token{}, prompts: map[turnKey][]hashing.Token{}, gens: map[turnKey]uint64{}}
	var ttft, tpot, later, latency time.Duration
	var nlater, ntpot int
	all := engines
	if h.prefill != nil {
		all = append([]*Engine{h.prefill}, engines...)
	}
	submit := func(s, turn int) error {
		prompt := append(append(append([]hashing.Token(nil), sys...), history[s]...), w.userTokens(s, turn, vocab)...)
		history[s] = prompt[len(sys):]
		id := connector.RequestID(fmt.Sprintf("s%d-t%d", s, turn))
		k := turnKey{s, turn}
		turnOf[id] = k
		st.PromptTokens += len(prompt)
		e := engines[route(s, turn)]
		st.prompts[k] = prompt
		st.gens[k] = e.cfg.Identity.Generation
		added[k] = time.Now()
		if h.prefill != nil {
			return h.prefill.Submit(id, prompt, 1, nil, prefilled)
		}
		return e.Submit(id, prompt, w.Output, nil, done)
	}
	start := time.Now()
	for s := 0; s < w.Sessions; s++ {
		if err := submit(s, 0); err != nil {
			return st, err
		}
	}
	total := w.Sessions * w.Turns
	ended := 0
	var wakes []<-chan struct{}
	woken := false // a connector had news: every engine steps once
	for ended < total {
		stepped := false
		for _, e := range all {
			if !e.Busy() || h.wait && !woken && e.Idle() {
				continue
			}
			if err := e.Step(ctx); err != nil {
				return st, err
			}
			st.Steps++
			stepped = true
		}
		if !stepped && h.wait {
			// Every engine waits for its connector: block until one
			// has news.
			wakes = wakes[:0]
			for _, e := range all {
				if e.Busy() {
					wakes = e.Wakes(wakes)
				}
			}
			if err := waitAny(ctx, wakes); err != nil {
				return st, fmt.Errorf("waiting for the connectors (%d requests of %d ended): %w", ended, total, err)
			}
		}
		woken = !stepped && h.wait
		for len(prefilled) > 0 {
			f := <-prefilled
			k := turnOf[f.ID]
			if f.Err != nil {
				return st, fmt.Errorf("prefill of session %d turn %d: %w", k.Session, k.Turn, f.Err)
			}
			params := h.prefill.TransferParams(f.ID)
			if err := engines[route(k.Session, k.Turn)].Submit(f.ID, st.prompts[k], w.Output, params, done); err != nil {
				return st, err
			}
		}
		for len(done) > 0 {
			f := <-done
			ended++
			k := turnOf[f.ID]
			if f.Err != nil {
				st.Failed++
			} else {
				st.Succeeded++
			}
			st.outputs[k] = f.Out
			st.OutputTokens += len(f.Out)
			latency += f.Done.Sub(added[k])
			st.LocalTokens += f.Metrics.LocalTokens
			st.ExternalTokens += f.Metrics.ExternalTokens
			st.ComputedTokens += f.Metrics.ComputedTokens
			if !f.First.IsZero() {
				d := f.First.Sub(added[k])
				ttft += d
				if k.Turn > 0 {
					later += d
					nlater++
				}
			}
			if len(f.Out) > 1 {
				tpot += f.Done.Sub(f.First) / time.Duration(len(f.Out)-1)
				ntpot++
			}
			history[k.Session] = append(history[k.Session], f.Out...)
			if k.Turn+1 < w.Turns {
				if err := submit(k.Session, k.Turn+1); err != nil {
					return st, err
				}
			}
			if progress != nil {
				progress(ended, total)
			}
			if h.onEnd != nil {
				if err := h.onEnd(ended); err != nil {
					return st, err
				}
			}
		}
	}
	st.Duration = time.Since(start)
	// Every request has ended; the saves of the last ones may still run.
	// Drain them before the engines close, or closing cancels them.
	for i, e := range all {
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := e.Drain(dctx)
		cancel()
		if err != nil {
			return st, fmt.Errorf("engine %d: %w", i, err)
		}
	}
	if ended > 0 {
		st.TTFT = ttft / time.Duration(ended)
		st.Latency = latency / time.Duration(ended)
	}
	if ntpot > 0 {
		st.TPOT = tpot / time.Duration(ntpot)
	}
	if nlater > 0 {
		st.LaterTTFT = later / time.Duration(nlater)
	}
	for _, e := range all {
		st.IdleSteps += e.IdleSteps()
		ss := e.sched.Stats()
		st.InlineLoads += ss.InlineLoads
		st.DiscardedSteps += ss.DiscardedSteps
		s, wk := e.ConnStats()
		st.ConnLoads += wk.Loads
		st.ConnLoadBytes += wk.LoadBytes
		st.ConnLoadTokens = addTokens(st.ConnLoadTokens, wk)
		st.ConnSaves += wk.Saves
		st.ConnFailures += wk.LoadFailures + s.SaveFailures
		st.ConnCorrupt += wk.Corrupt
		st.ConnNanos += s.LookupNanos + wk.TransferNanos
		st.ConnLookupNanos += s.LookupNanos
		st.ConnLookups += s.Lookups
	}
	return st, nil
}

// sameOutputs compares every generated token of two runs; it returns the
// first turn that differs.
func sameOutputs(a, b Stats) (turnKey, bool) {
	if len(a.outputs) != len(b.outputs) {
		return turnKey{-1, -1}, false
	}
	for k, out := range a.outputs {
		o2, ok := b.outputs[k]
		if !ok || len(o2) != len(out) {
			return k, false
		}
		for i := range out {
			if out[i] != o2[i] {
				return k, false
			}
		}
	}
	return turnKey{}, true
}

// waitAny blocks until one of chans receives or ctx ends.
func waitAny(ctx context.Context, chans []<-chan struct{}) error {
	cases := make([]reflect.SelectCase, 0, len(chans)+1)
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
	for _, c := range chans {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
	}
	if i, _, _ := reflect.Select(cases); i == 0 {
		return ctx.Err()
	}
	return nil
}
