package main

import (
	"bytes"
	"context"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestTieredRestart runs the workload over -store tiered, with a RAM tier
// too small for it, and the restart scenario: a second process on the
// same disk directory is served from the disk and generates the same
// tokens as the run without a connector.
func TestTieredRestart(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("store/diskstore runs on Linux")
	}
	o := small(t)
	o.Store = "tiered"
	o.Tiered.RAMBytes = 64 << 10
	o.Tiered.DiskBytes = 64 << 20
	o.Tiered.Restart = true
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	var out, errw bytes.Buffer
	if err := Main(context.Background(), o, &out, &errw); err != nil {
		t.Fatalf("Main: %v\n%s\n%s", err, out.String(), errw.String())
	}
	report := out.String()
	for _, want := range []string{"outputs identical: yes", "store: tiered: memstore of 64 KiB over diskstore of 64 MiB", "restart: a second process"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	m := regexp.MustCompile(`restart: .*external hit rate (\d+)%, (\d+) blocks loaded \(hits by tier: CPU \d+, DISK (\d+); tokens loaded from RAM (\d+), from disk (\d+)\); outputs identical`).FindStringSubmatch(report)
	if m == nil {
		t.Fatalf("no restart line with outputs identical:\n%s", report)
	}
	if loaded, _ := strconv.Atoi(m[2]); loaded == 0 {
		t.Errorf("the restarted process loaded no blocks:\n%s", report)
	}
	if disk, _ := strconv.Atoi(m[3]); disk == 0 {
		t.Errorf("the restarted process had no hits from the disk tier:\n%s", report)
	}
	// Every block loaded counts its tokens in the tier that served it.
	loaded, _ := strconv.Atoi(m[2])
	ram, _ := strconv.Atoi(m[4])
	disk, _ := strconv.Atoi(m[5])
	if disk == 0 || ram+disk != loaded*o.Block {
		t.Errorf("the restarted process loaded %d tokens from RAM and %d from disk; want some from disk, and %d in all (%d blocks of %d tokens):\n%s", ram, disk, loaded*o.Block, loaded, o.Block, report)
	}
	if !strings.Contains(report, "tokens loaded from disk") {
		t.Errorf("the table has no row of tokens loaded from disk:\n%s", report)
	}
}

// TestTieredOptionsRejected: the tiered flags without -store tiered, or
// out of range, are errors naming the flag.
func TestTieredOptionsRejected(t *testing.T) {
	for _, tc := range []struct {
		set  func(*Options)
		want string
	}{
		{func(o *Options) { o.Tiered.Restart = true }, "-store tiered"},
		{func(o *Options) { o.Store = "tiered"; o.Tiered.DiskBytes = 1000 }, "-disk-bytes"},
		{func(o *Options) { o.Store = "tiered"; o.Tiered.RAMBytes = -1 }, "-ram-bytes"},
	} {
		o := defaultOptions()
		tc.set(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want an error naming %s", err, tc.want)
		}
	}
}
