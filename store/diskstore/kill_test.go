//go:build linux

package diskstore_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/diskstore"
)

// killSizes are the value sizes the putting child cycles through: small
// ones packed, and page-multiple ones laid out for direct reads.
var killSizes = []int{3000, 64 << 10, 100, 16 << 10, 200 << 10}

const killBatch = 4

func killCfg(dir string) diskstore.Config {
	return diskstore.Config{Dir: dir, Capacity: 1 << 30, SegmentSize: 4 << 20}
}

// TestKillChild is the child process of TestKill: it puts batches of
// values into the store on $DISKSTORE_KILL_DIR from key $DISKSTORE_KILL_FROM
// on, and prints the count of keys stored after each batch, until killed.
func TestKillChild(t *testing.T) {
	dir := os.Getenv("DISKSTORE_KILL_DIR")
	if dir == "" {
		t.Skip("the child process of TestKill")
	}
	from, err := strconv.Atoi(os.Getenv("DISKSTORE_KILL_FROM"))
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, killCfg(dir))
	mems := make([]rdma.Region, killBatch)
	for j := range mems {
		mems[j] = buf(t, 256<<10)
	}
	srcs := make([]rdma.Region, killBatch)
	keys := make([]string, killBatch)
	res := make([]store.Result, killBatch)
	for i := from; ; i += killBatch {
		for j := range keys {
			keys[j] = fmt.Sprintf("key-%d", i+j)
			srcs[j] = fill(mems[j], i+j, killSizes[(i+j)%len(killSizes)])
		}
		if err := s.Put(bg, keys, srcs, res); err != nil {
			t.Fatal(err)
		}
		for j, r := range res {
			if r.Err != nil {
				t.Fatalf("Put(%q) = %v", keys[j], r.Err)
			}
		}
		fmt.Printf("stored %d\n", i+killBatch)
	}
}

// TestKill runs a child process that puts values in a loop, kills it with
// SIGKILL while it writes, and opens the directory: every value is whole
// or absent, and every value the child was told was stored is there. It
// does so twice on the same directory.
func TestKill(t *testing.T) {
	if os.Getenv("DISKSTORE_KILL_DIR") != "" {
		t.Skip("in the child")
	}
	dir := t.TempDir()
	from := 0
	type span struct{ lo, hi int }
	var acked []span // the keys the child was told were stored
	isAcked := func(i int) bool {
		for _, a := range acked {
			if i >= a.lo && i < a.hi {
				return true
			}
		}
		return false
	}
	for round := range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "DISKSTORE_KILL_DIR="+dir, "DISKSTORE_KILL_FROM="+strconv.Itoa(from))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		said := make(chan int, 1024)
		go func() {
			defer close(said)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var n int
				if _, err := fmt.Sscanf(sc.Text(), "stored %d", &n); err == nil {
					said <- n
				}
			}
		}()
		// Wait until the child has stored 200 keys this round, then kill it
		// in the middle of whatever it writes.
		stored := from
		deadline := time.After(2 * time.Minute)
	wait:
		for stored < from+200 {
			select {
			case n, ok := <-said:
				if !ok {
					cmd.Wait()
					t.Fatalf("round %d: the child ended after storing %d keys: %s", round, stored, stderr.String())
				}
				stored = n
			case <-deadline:
				break wait
			}
		}
		if stored < from+200 {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("round %d: the child stored %d keys in 2 minutes, want %d: %s", round, stored-from, 200, stderr.String())
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for n := range said { // what it printed before it died
			stored = n
		}
		cmd.Wait()
		acked = append(acked, span{from, stored})

		s := open(t, killCfg(dir))
		dst, want := buf(t, 256<<10), buf(t, 256<<10)
		present := 0
		for i := range stored + 16*killBatch {
			key := fmt.Sprintf("key-%d", i)
			got, err := get(t, s, key, dst)
			switch {
			case errors.Is(err, store.ErrNotFound) && isAcked(i):
				t.Errorf("round %d: Get(%q) = %v, but the child had stored it", round, key, err)
			case errors.Is(err, store.ErrNotFound):
			case err != nil:
				t.Errorf("round %d: Get(%q) = %v", round, key, err)
			default:
				present++
				if !bytes.Equal(got, fill(want, i, killSizes[i%len(killSizes)]).Bytes()) {
					t.Errorf("round %d: Get(%q) = %d bytes not its value", round, key, len(got))
				}
			}
		}
		t.Logf("round %d: the child stored %d keys before it was killed; %d read back whole; %+v", round, stored, present, s.IO())
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		from = stored + 16*killBatch
	}
}
