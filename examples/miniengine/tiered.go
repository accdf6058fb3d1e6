package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/store/diskstore"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/tiered"
)

// TieredOptions are the settings of -store tiered: a RAM tier (memstore)
// over a disk tier (diskstore), and the restart scenario.
type TieredOptions struct {
	DiskDir   string // the disk tier's directory; "": a fresh one per run, removed after it
	DiskBytes int64  // the disk tier's capacity in bytes of segment files
	RAMBytes  int64  // the RAM tier's capacity; 0: -store-bytes, or everything fits
	Restart   bool   // run the restart scenario

	onClose func([]tiered.TierStats) // called with the tiers' figures as the store closes
}

const (
	restartDirEnv     = "MINIENGINE_RESTART_DIR"     // this process is the second of -restart, on this directory
	restartOptionsEnv = "MINIENGINE_RESTART_OPTIONS" // its Options, JSON
)

func (t *TieredOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&t.DiskDir, "disk-dir", t.DiskDir, "-store tiered: the disk tier's directory (default: a fresh one per run, removed after it)")
	fs.Int64Var(&t.DiskBytes, "disk-bytes", t.DiskBytes, "-store tiered: the disk tier's capacity in bytes")
	fs.Int64Var(&t.RAMBytes, "ram-bytes", t.RAMBytes, "-store tiered: the RAM tier's capacity in bytes (0: -store-bytes, or everything fits)")
	fs.BoolVar(&t.Restart, "restart", t.Restart, "with -store tiered: run the workload with the connector on, end the store, and run it again in a second process of this binary on the same disk directory, whose RAM tier and KV pool start empty: every hit comes from the disk")
}

func (t TieredOptions) validate(store string) error {
	switch {
	case store != "tiered" && (t.Restart || t.DiskDir != "" || t.RAMBytes != 0):
		return fmt.Errorf("-restart, -disk-dir and -ram-bytes need -store tiered")
	case t.DiskBytes < 1<<20:
		return fmt.Errorf("-disk-bytes = %d, want at least 1 MiB", t.DiskBytes)
	case t.RAMBytes < 0:
		return fmt.Errorf("-ram-bytes = %d, want >= 0", t.RAMBytes)
	}
	return nil
}

// newTiered opens the store of -store tiered: a memstore of ramBytes over
// a diskstore on o.Tiered.DiskDir (or a fresh directory). The returned
// function closes it (and removes a fresh directory).
func (o Options) newTiered(ramBytes int64) (*tiered.Store, func() error, error) {
	if o.Tiered.RAMBytes > 0 {
		ramBytes = o.Tiered.RAMBytes
	}
	dir, temp := o.Tiered.DiskDir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "miniengine-disk-")
		if err != nil {
			return nil, nil, err
		}
		dir, temp = d, true
	}
	drop := func() error {
		if temp {
			return os.RemoveAll(dir)
		}
		return nil
	}
	ram, err := memstore.New(memstore.Config{Capacity: ramBytes})
	if err != nil {
		return nil, nil, errors.Join(err, drop())
	}
	disk, err := diskstore.Open(diskstore.Config{Dir: dir, Capacity: o.Tiered.DiskBytes})
	if err != nil {
		return nil, nil, errors.Join(err, ram.Close(), drop())
	}
	s, err := tiered.New(tiered.Config{Tiers: []tiered.Tier{
		{Store: ram, Medium: tiered.MediumCPU},
		{Store: disk, Medium: tiered.MediumDisk},
	}})
	if err != nil {
		return nil, nil, errors.Join(err, ram.Close(), disk.Close(), drop())
	}
	return s, func() error {
		if o.Tiered.onClose != nil {
			o.Tiered.onClose(s.Tiers())
		}
		return errors.Join(s.Close(), drop())
	}, nil
}

// restartReport is what the second process of -restart reports on its
// stdout: its run, its outputs to compare with the first run's, and its
// tiers' figures.
type restartReport struct {
	Run     Run                `json:"run"`
	Outputs []restartOutput    `json:"outputs"`
	Tiers   []tiered.TierStats `json:"tiers"`
}

type restartOutput struct {
	Session, Turn int
	Tokens        []hashing.Token
}

// restart runs the workload with the connector on over -store tiered,
// closes the store, and runs it again in a second process of this binary
// on the same directory: its RAM tier and KV pool start empty, so the
// hits come from what the first process left on disk. It returns the
// second process's run and tiers.
func restart(ctx context.Context, o Options) (Run, []tiered.TierStats, error) {
	dir := o.Tiered.DiskDir
	if dir == "" {
		d, err := os.MkdirTemp("", "miniengine-restart-")
		if err != nil {
			return Run{}, nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	o.Tiered.DiskDir = dir
	if _, err := runOnce(ctx, o, true, o.Blocks, func(int, int) {}); err != nil {
		return Run{}, nil, fmt.Errorf("first process: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return Run{}, nil, err
	}
	opts, err := json.Marshal(o)
	if err != nil {
		return Run{}, nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), restartDirEnv+"="+dir, restartOptionsEnv+"="+string(opts))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return Run{}, nil, fmt.Errorf("second process: %w (stderr: %s)", err, strings.TrimSpace(stderr.String()))
	}
	var rep restartReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		return Run{}, nil, fmt.Errorf("second process: its report: %w (stderr: %s)", err, strings.TrimSpace(stderr.String()))
	}
	rep.Run.stats.outputs = make(map[turnKey][]hashing.Token, len(rep.Outputs))
	for _, out := range rep.Outputs {
		rep.Run.stats.outputs[turnKey{out.Session, out.Turn}] = out.Tokens
	}
	return rep.Run, rep.Tiers, nil
}

// restartChild is the second process of -restart: it runs the workload
// with the connector on over -store tiered, with its parent's options, on
// the directory its parent names, and reports on stdout.
func restartChild(ctx context.Context, stdout, stderr io.Writer) int {
	o := defaultOptions()
	if err := json.Unmarshal([]byte(os.Getenv(restartOptionsEnv)), &o); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", restartOptionsEnv, err)
		return 2
	}
	o.Tiered.DiskDir = os.Getenv(restartDirEnv)
	o.Tiered.Restart, o.Progress = false, false
	var tiers []tiered.TierStats
	o.Tiered.onClose = func(ts []tiered.TierStats) { tiers = ts }
	st, err := runOnce(ctx, o, true, o.Blocks, func(int, int) {})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	rep := restartReport{Run: newRun("restarted process, connector on", true, o.Blocks, st), Tiers: tiers}
	for k, toks := range st.outputs {
		rep.Outputs = append(rep.Outputs, restartOutput{k.Session, k.Turn, toks})
	}
	if err := json.NewEncoder(stdout).Encode(rep); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// printRestart prints the restart scenario's line.
func printRestart(out io.Writer, r Run, tiers []tiered.TierStats, verdict string) {
	var parts []string
	for _, t := range tiers {
		parts = append(parts, fmt.Sprintf("%s %d", t.Medium, t.Hits))
	}
	var toks tierTokens
	if r.TierTokens != nil {
		toks = *r.TierTokens
	}
	fmt.Fprintf(out, "\nrestart: a second process on the same disk directory, RAM tier and KV pool empty: TTFT %.1f ms, external hit rate %.0f%%, %d blocks loaded (hits by tier: %s; tokens loaded from RAM %d, from disk %d); outputs %s\n",
		r.TTFTms, 100*r.ExtHitRate, r.BlocksLoaded, strings.Join(parts, ", "), toks.CPU, toks.Disk, verdict)
}

// tierTokens are the tokens a run loaded, by the medium of the store tier
// that served them (the LoadTokens fields of connector.Stats), as -json
// reports them.
type tierTokens struct {
	CPU     int64 `json:"CPU"`
	Disk    int64 `json:"DISK"`
	Storage int64 `json:"STORAGE"`
	Other   int64 `json:"other"`
}

// newTierTokens returns t for -json, or nil when no tier served a token
// (a store not in tiers, a run without a connector).
func newTierTokens(t tierTokens) *tierTokens {
	if t == (tierTokens{}) {
		return nil
	}
	return &t
}

// addTokens returns t plus the LoadTokens fields of st.
func addTokens(t tierTokens, st connector.Stats) tierTokens {
	t.CPU += st.LoadTokensCPU
	t.Disk += st.LoadTokensDisk
	t.Storage += st.LoadTokensStorage
	t.Other += st.LoadTokensOther
	return t
}

// describe names the store of -store tiered for the table's header.
func (t TieredOptions) describe(storeBytes int64) string {
	ram := "as much as the workload needs"
	switch {
	case t.RAMBytes > 0:
		ram = sizeString(t.RAMBytes)
	case storeBytes > 0:
		ram = sizeString(storeBytes)
	}
	return fmt.Sprintf("tiered: memstore of %s over diskstore of %s", ram, sizeString(t.DiskBytes))
}

func sizeString(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}
