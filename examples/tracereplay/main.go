// Command tracereplay replays a request trace in the Mooncake format (the
// FAST'25 release: JSON Lines with timestamp, input_length, output_length
// and hash_ids of 512-token blocks) through the real path: the scheduler
// package, the reference store connector (connector/storeconn) and a store
// (the embedded memstore, the same served over store/remote, or Mooncake
// Store), and reports the hit rates it got against the most the trace
// allows, the work it saved by a cost model, and what the store and
// lookup path cost, for one store capacity or a sweep of them.
//
//	go run ./examples/tracereplay examples/tracereplay/testdata/conversation_trace.jsonl.gz
//
// No model runs. Each trace block's tokens derive from its hash id (equal
// ids, equal tokens), a prompt is the concatenation, and each engine
// writes as KV of every position it computes bytes derived from the
// position and its token (-kv-bytes per token, real memory, saved and
// loaded through the store); every reused block is checked byte for byte
// before the request computes on it. Requests run one after another, in
// trace order, each to its first token, its saves finished, before the
// next starts, so that any earlier request's blocks can serve a later one
// (as the theoretical maximum assumes); decode, GPU time and time to first
// token come from the cost model (see Cost), not from the clock.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvconnect/kvconnect/connector"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := Main(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "tracereplay:", err)
		}
		os.Exit(2)
	}
}

// Options are the command's flags.
type Options struct {
	Trace          string
	Setup          Setup
	Capacities     []int64 // store capacities in tokens; 0 is unbounded
	Store          string
	MooncakeConfig string
	Requests       int // replay only the first Requests requests; 0: all
	JSON           bool
	Plot           string
	Off            bool // also replay with the connector off
	CPUProfile     string
	MemProfile     string
}

// defaultConnector is the connector's config: the reference store
// connector, saving and loading.
const defaultConnector = `{"kv_connector": "StoreConnector", "kv_role": "kv_both"}`

// Main runs the command with args, writing its report to out.
func Main(ctx context.Context, args []string, out, errw io.Writer) error {
	o, err := parseFlags(args, errw)
	if err != nil {
		return err
	}
	tr, err := ReadTraceFile(o.Trace)
	if err != nil {
		return err
	}
	if o.Requests > 0 && o.Requests < len(tr.Requests) {
		tr.Requests = tr.Requests[:o.Requests]
	}
	if o.CPUProfile != "" {
		f, err := os.Create(o.CPUProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := Replay(ctx, tr, o)
	if err != nil {
		return err
	}
	if o.MemProfile != "" {
		if err := writeHeapProfile(o.MemProfile); err != nil {
			return fmt.Errorf("-memprofile: %w", err)
		}
	}
	if o.Plot != "" && len(rep.Runs) > 1 {
		if err := os.WriteFile(o.Plot, []byte(Plot(rep)), 0o644); err != nil {
			return fmt.Errorf("-plot: %w", err)
		}
	}
	if o.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.Text(out)
	if o.Plot != "" && len(rep.Runs) > 1 {
		fmt.Fprintf(out, "\nplot: %s\n", o.Plot)
	}
	return nil
}

func parseFlags(args []string, errw io.Writer) (Options, error) {
	o := Options{
		Setup: Setup{BlockSize: 16, BytesPerToken: 2, Instances: 1, Route: "round-robin", PoolTokens: 256 << 10, Cost: DefaultCost},
		Store: "memstore",
		Off:   true,
	}
	fs := flag.NewFlagSet("tracereplay", flag.ContinueOnError)
	fs.SetOutput(errw)
	fs.Usage = func() {
		fmt.Fprintf(errw, "usage: tracereplay [flags] TRACE.jsonl[.gz]\n\nReplays a Mooncake-format trace through the scheduler, the store connector and a store.\n\n")
		fs.PrintDefaults()
	}
	capacity := "1M,3M,10M,50M"
	connCfg := defaultConnector
	loadGbps := DefaultCost.LoadBps / 1e9
	fs.IntVar(&o.Setup.BlockSize, "block", o.Setup.BlockSize, "tokens per KV block; must divide 512")
	fs.IntVar(&o.Setup.BytesPerToken, "kv-bytes", o.Setup.BytesPerToken, "real KV bytes per token the engines write, save, load and verify (small, so that the trace fits in memory)")
	fs.IntVar(&o.Setup.Instances, "instances", o.Setup.Instances, "engine instances sharing the store")
	fs.StringVar(&o.Setup.Route, "route", o.Setup.Route, "how requests go to instances: round-robin, or prefix (the instance that last ran the longest prefix of the request's trace blocks)")
	fs.IntVar(&o.Setup.PoolTokens, "pool", o.Setup.PoolTokens, "each instance's KV pool in tokens (its local prefix cache); must hold the longest prompt")
	fs.StringVar(&capacity, "capacity", capacity, "store capacities in tokens of KV, comma-separated, with K or M suffixes, or unbounded: one run each")
	fs.StringVar(&o.Store, "store", o.Store, "the store: memstore (embedded), remote (a memstore served over store/remote on a unix socket) or mooncake (MOONCAKE_CONFIG_PATH or -mooncake-config)")
	fs.StringVar(&o.MooncakeConfig, "mooncake-config", "", "Mooncake config JSON (default: MOONCAKE_CONFIG_PATH)")
	fs.StringVar(&connCfg, "connector", connCfg, "the connector's kv_transfer_config (JSON)")
	fs.IntVar(&o.Requests, "requests", 0, "replay only the trace's first N requests (0: all)")
	fs.BoolVar(&o.JSON, "json", false, "print the report as JSON")
	fs.StringVar(&o.Plot, "plot", "tracereplay.svg", "write the hit rate against capacity to this SVG file when several capacities run (empty: none)")
	fs.BoolVar(&o.Off, "off", o.Off, "also replay with the connector off, for the tokens computed without it")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of the replay to this file")
	fs.StringVar(&o.MemProfile, "memprofile", "", "write a heap profile at the end of the replay to this file")
	fs.StringVar(&o.Setup.Cost.Model, "cost-model", o.Setup.Cost.Model, "what the cost model's figures describe (a label)")
	fs.Float64Var(&o.Setup.Cost.PrefillTPS, "prefill-tps", o.Setup.Cost.PrefillTPS, "cost model: prefill tokens per second with no context")
	fs.Float64Var(&o.Setup.Cost.PrefillGrowth, "prefill-growth", o.Setup.Cost.PrefillGrowth, "cost model: extra prefill time per token for each 1,000 tokens of context (0.033 = 3.3%)")
	fs.DurationVar(&o.Setup.Cost.DecodeTime, "decode-time", o.Setup.Cost.DecodeTime, "cost model: time of one decode step")
	fs.Int64Var(&o.Setup.Cost.KVBytesPerToken, "model-kv-bytes", o.Setup.Cost.KVBytesPerToken, "cost model: the model's KV bytes per token, for load times")
	fs.Float64Var(&loadGbps, "load-gbps", loadGbps, "cost model: external KV load bandwidth, GB/s")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.Setup.Cost.LoadBps = loadGbps * 1e9
	if fs.NArg() != 1 {
		fs.Usage()
		return o, fmt.Errorf("want one trace file argument, got %d", fs.NArg())
	}
	o.Trace = fs.Arg(0)
	var err error
	if o.Capacities, err = parseCapacities(capacity); err != nil {
		return o, err
	}
	if o.Setup.Connector, err = connector.ParseConfig([]byte(connCfg)); err != nil {
		return o, fmt.Errorf("-connector: %w", err)
	}
	if o.Requests < 0 {
		return o, fmt.Errorf("-requests = %d, want >= 0", o.Requests)
	}
	if o.Store == "mooncake" && len(o.Capacities) > 1 {
		return o, fmt.Errorf("-capacity %s with -store mooncake: a Mooncake store's capacity is its segments' (global_segment_size), one run", capacity)
	}
	if err := o.Setup.Validate(); err != nil {
		return o, err
	}
	return o, nil
}

// parseCapacities parses -capacity: token counts with optional K (x1000)
// or M (x1,000,000) suffixes, or "unbounded" (0).
func parseCapacities(s string) ([]int64, error) {
	var caps []int64
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "unbounded" {
			caps = append(caps, 0)
			continue
		}
		mul := int64(1)
		switch {
		case strings.HasSuffix(f, "K"), strings.HasSuffix(f, "k"):
			mul, f = 1000, f[:len(f)-1]
		case strings.HasSuffix(f, "M"), strings.HasSuffix(f, "m"):
			mul, f = 1000000, f[:len(f)-1]
		}
		v, err := strconv.ParseFloat(f, 64)
		n := int64(v * float64(mul))
		if err != nil || !(v > 0) || n < 1 || v*float64(mul) > 1e15 {
			return nil, fmt.Errorf("-capacity: %q, want a number of tokens above 0 (with K or M), or unbounded", f)
		}
		caps = append(caps, n)
	}
	return caps, nil
}

// Report is the outcome of a replay: the trace's bound and one run per
// capacity.
type Report struct {
	Trace    string   `json:"trace"`
	Requests int      `json:"requests"`
	Setup    setupOut `json:"setup"`
	Bound    Bound    `json:"bound"`
	// OffComputed is the prefill tokens computed with the connector off
	// (local prefix caches only); 0 when not run.
	OffComputed int64     `json:"off_computed_tokens"`
	OffWall     float64   `json:"off_wall_seconds,omitempty"`
	Runs        []*Result `json:"runs"`
}

type setupOut struct {
	BlockSize     int    `json:"block_size"`
	BytesPerToken int    `json:"kv_bytes_per_token"`
	Instances     int    `json:"instances"`
	Route         string `json:"route"`
	PoolTokens    int    `json:"pool_tokens"`
	Store         string `json:"store"`
	Cost          Cost   `json:"cost"`
}

// Replay runs tr once per capacity of o (and once with the connector off,
// if o.Off).
func Replay(ctx context.Context, tr *Trace, o Options) (*Report, error) {
	su := o.Setup
	if err := su.Validate(); err != nil {
		return nil, err
	}
	for _, r := range tr.Requests {
		if r.Input+1 > su.PoolTokens {
			return nil, fmt.Errorf("-pool = %d tokens: the trace's line %d has a prompt of %d tokens, which does not fit", su.PoolTokens, r.Line, r.Input)
		}
	}
	rep := &Report{
		Trace: filepath.Base(tr.Name), Requests: len(tr.Requests),
		Setup: setupOut{su.BlockSize, su.BytesPerToken, su.Instances, su.Route, su.PoolTokens, o.Store, su.Cost},
		Bound: ComputeBound(tr, su.BlockSize),
	}
	if o.Off {
		off := su
		off.Off = true
		start := time.Now()
		res, err := replayOnce(ctx, tr, off, nil)
		if err != nil {
			return nil, fmt.Errorf("connector off: %w", err)
		}
		rep.OffComputed = res.ComputedTokens
		rep.OffWall = time.Since(start).Seconds()
	}
	for _, c := range o.Capacities {
		res, err := runCapacity(ctx, tr, o, c, rep.Bound.Keys)
		if err != nil {
			return nil, fmt.Errorf("capacity %d tokens: %w", c, err)
		}
		res.BoundHitRate = rep.Bound.HitRate()
		res.OffComputed = rep.OffComputed
		rep.Runs = append(rep.Runs, res)
	}
	return rep, nil
}

// runCapacity opens a store of capacity tokens and replays tr over it.
func runCapacity(ctx context.Context, tr *Trace, o Options, capacity, keys int64) (res *Result, err error) {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	ost, err := openStore(ctx, o.Store, capacity, keys, o.Setup.BlockSize, o.Setup.BytesPerToken, o.MooncakeConfig)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, ost.close()) }()
	res, err = replayOnce(ctx, tr, o.Setup, ost)
	if err != nil {
		return nil, err
	}
	res.Store, res.CapacityTokens = o.Store, capacity
	if o.Store == "mooncake" {
		res.CapacityTokens = -1 // the segments' (global_segment_size)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	st := ost.inner.Stats()
	res.StoreKeys, res.Evictions = st.Keys, st.Evictions
	if st.Keys > 0 {
		res.HeapBytesPerKey = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(st.Keys)
	}
	res.RSSBytes, res.PeakRSSBytes = rss()
	return res, nil
}

// replayOnce replays tr on fresh instances over os (nil with Setup.Off).
func replayOnce(ctx context.Context, tr *Trace, su Setup, ost *openedStore) (*Result, error) {
	id := identity(su.BlockSize, su.BytesPerToken)
	rp := &replayer{su: su}
	if su.Route == "prefix" {
		rp.router = make(map[int64]int)
	}
	defer func() {
		for _, in := range rp.ins {
			in.close()
		}
	}()
	for range su.Instances {
		var st = ost
		var in *instance
		var err error
		if st != nil {
			in, err = newInstance(su, id, st.st)
		} else {
			in, err = newInstance(su, id, nil)
		}
		if err != nil {
			return nil, err
		}
		rp.ins = append(rp.ins, in)
	}
	start := time.Now()
	if err := rp.run(ctx, tr); err != nil {
		return nil, err
	}
	wall := time.Since(start)
	rp.finish()
	res := rp.res
	res.WallSeconds = wall.Seconds()
	for _, in := range rp.ins {
		in.connectorStats(&res)
	}
	if t := res.ConnectorSeconds + res.PrefillSeconds; t > 0 {
		res.ConnectorShare = res.ConnectorSeconds / t
	}
	if ost != nil {
		calls, keys, total, p50, p99 := ost.timed.lookups()
		res.Lookups, res.LookupKeys = calls, keys
		res.LookupsPerSec = float64(calls) / wall.Seconds()
		if total > 0 {
			res.LookupKeysPerS = float64(keys) / total.Seconds()
		}
		res.LookupP50Us, res.LookupP99Us = float64(p50)/1e3, float64(p99)/1e3
		ost.timed.mu.Lock()
		res.Puts, res.PutKeys = ost.timed.puts, ost.timed.putKeys
		if ost.timed.puts > 0 {
			res.PutMsPerCall = ost.timed.putTime.Seconds() * 1e3 / float64(ost.timed.puts)
		}
		ost.timed.mu.Unlock()
	}
	return &res, nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// rss returns the process's resident set size now and at its peak, from
// /proc (0 where there is none).
func rss() (now, peak int64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			now = v << 10
		case "VmHWM:":
			peak = v << 10
		}
	}
	return now, peak
}

// Text writes the report as a table, one row per capacity.
func (rep *Report) Text(w io.Writer) {
	su := rep.Setup
	fmt.Fprintf(w, "trace %s: %d requests, %d prompt tokens; %d-token blocks: %d distinct blocks; theoretical maximum hit rate %.1f%%\n",
		rep.Trace, rep.Requests, rep.Bound.InputTokens, su.BlockSize, rep.Bound.Keys, 100*rep.Bound.HitRate())
	fmt.Fprintf(w, "%d instance(s), route %s, KV pool %d tokens each, %d KV bytes per token; store %s\n", su.Instances, su.Route, su.PoolTokens, su.BytesPerToken, su.Store)
	fmt.Fprintf(w, "cost model: %s\n", su.Cost.Model)
	if rep.OffComputed > 0 {
		fmt.Fprintf(w, "connector off: %d tokens computed (local prefix caches only, hit rate %.1f%%), %.1f s\n",
			rep.OffComputed, 100*(1-ratio(rep.OffComputed, rep.Bound.InputTokens)), rep.OffWall)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "capacity\tkeys\tlocal\texternal\thit\tmax\tcomputed\tvs off\tprefill GPU\tTTFT p50\tp99\tlookups/s\tlookup p50\tp99\theap/key\tRSS\twall\t")
	for _, r := range rep.Runs {
		capS := capacityString(r.CapacityTokens)
		vs := "-"
		if r.OffComputed > 0 {
			vs = fmt.Sprintf("%.2fx", float64(r.ComputedTokens)/float64(r.OffComputed))
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%.1f%%\t%.1f%%\t%.1f%%\t%d\t%s\t%.0f s\t%.0f ms\t%.0f ms\t%.0f\t%.0f µs\t%.0f µs\t%.0f B\t%d MB\t%.1f s\t\n",
			capS, r.StoreKeys, 100*r.LocalHitRate, 100*r.ExternalRate, 100*r.HitRate, 100*r.BoundHitRate,
			r.ComputedTokens, vs, r.PrefillSeconds, r.TTFTP50Ms, r.TTFTP99Ms, r.LookupsPerSec, r.LookupP50Us, r.LookupP99Us,
			r.HeapBytesPerKey, r.RSSBytes>>20, r.WallSeconds)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "capacity\tlookups\tkeys/lookup\tput calls\tkeys/put\tms/put\tevictions\tconnector time\tof prefill GPU + it\tfailed saves\tfailed loads\tstore errors\t")
	for _, r := range rep.Runs {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%d\t%.0f\t%.3f\t%d\t%.1f s\t%.2f%%\t%d\t%d\t%d\t\n",
			capacityString(r.CapacityTokens), r.Lookups, float64(r.LookupKeys)/float64(max(1, r.Lookups)), r.Puts, float64(r.PutKeys)/float64(max(1, r.Puts)),
			r.PutMsPerCall, r.Evictions, r.ConnectorSeconds, 100*r.ConnectorShare, r.SaveFailures, r.LoadFailures, r.StoreErrors)
	}
	tw.Flush()
}

func capacityString(c int64) string {
	switch {
	case c > 0:
		return tokensString(c)
	case c < 0:
		return "segment"
	}
	return "unbounded"
}

// tokensString writes n tokens with a K or M suffix where exact.
func tokensString(n int64) string {
	switch {
	case n >= 1000000 && n%100000 == 0:
		return strconv.FormatFloat(float64(n)/1e6, 'f', -1, 64) + "M"
	case n >= 1000 && n%100 == 0:
		return strconv.FormatFloat(float64(n)/1e3, 'f', -1, 64) + "K"
	}
	return strconv.FormatInt(n, 10)
}
