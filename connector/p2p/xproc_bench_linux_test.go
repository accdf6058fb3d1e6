//go:build linux

package p2p

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/mooncake"
	"github.com/kvconnect/kvconnect/rdma/shm"
)

// benchProducerEnv starts TestBenchProducer as the producer of
// BenchmarkCrossProcess, over the transfer engine it names.
const benchProducerEnv = "KVCONNECT_P2P_BENCH_PRODUCER"

// benchEngine opens a transfer engine of kind (TransferShm or
// TransferMooncake, configured from the environment) and returns it with
// a function allocating host memory it can register.
func benchEngine(kind string) (rdma.Engine, func(n int) (hostMem, error), error) {
	if kind == TransferMooncake {
		cfg, err := mooncake.ConfigFromEnv()
		if err != nil {
			return nil, nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		e, err := mooncake.Open(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		return e, func(n int) (hostMem, error) { return rdma.AllocHost(n) }, nil
	}
	e, err := shm.New(nil)
	if err != nil {
		return nil, nil, err
	}
	return e, func(n int) (hostMem, error) { return e.Alloc(n) }, nil
}

// The offer BenchmarkCrossProcess reads: 16 blocks of 2 MiB (one layer,
// one of K and V: a block is one span), and one more block holding the
// prompt's last token, which consumers do not read.
const (
	benchBlocks     = 16
	benchBlockBytes = 2 << 20
	benchBlockSize  = 16
)

func benchIdentity() hashing.Identity {
	return hashing.Identity{
		Tenant: "bench", Model: "p2ptest/model", WeightsVersion: "v1",
		Format: hashing.Format{Device: "cpu", ModelDType: "bf16", KVDType: "bf16"},
		Layout: hashing.Layout{Layers: 1, KVHeads: 4, HeadDim: 8, BlockSize: benchBlockSize, TPSize: 1, Replication: 1},
	}
}

func benchCache(m hostMem) connector.KVCache {
	return connector.KVCache{Layers: 1, Blocks: benchBlocks + 1, KV: 1, BlockBytes: benchBlockBytes, Order: connector.BlockMajor, Regions: []rdma.Region{m.Region()}}
}

// benchByte is byte i of the producer's KV memory.
func benchByte(i int) byte { return byte(i*7 + i>>13) }

// TestBenchProducer is the producer process of BenchmarkCrossProcess; it
// skips unless started by it. It offers one request of 17 blocks over the
// transfer engine benchProducerEnv names, prints the transfer parameters, and holds the offer until
// its stdin closes: it never polls, so the offer stays armed however
// often a consumer reads it.
func TestBenchProducer(t *testing.T) {
	kind := os.Getenv(benchProducerEnv)
	if kind == "" {
		t.Skip("the producer process of BenchmarkCrossProcess, started by it")
	}
	e, alloc, err := benchEngine(kind)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	m, err := alloc((benchBlocks + 1) * benchBlockBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	for i := range m.Bytes() {
		m.Bytes()[i] = benchByte(i)
	}
	cfg := connector.Config{Connector: Name, Role: connector.RoleProducer, EngineID: "bench-prefill", Extra: map[string]any{"keep_timeout": "1h"}}
	s, ws, err := New(cfg, connector.Env{Identity: benchIdentity()}, e)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer ws[0].Close()
	if err := ws[0].Register(benchCache(m)); err != nil {
		t.Fatal(err)
	}
	tokens := prompt(5, (benchBlocks+1)*benchBlockSize)
	hashes, err := hashing.HashBlocks(benchBlockSize, tokens)
	if err != nil {
		t.Fatal(err)
	}
	req := &connector.Request{ID: "r", Prompt: len(tokens), Hashes: hashes}
	blocks := make([]connector.BlockID, benchBlocks+1)
	for i := range blocks {
		blocks[i] = connector.BlockID(i)
	}
	if _, err := s.Match(req, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Allocated(req, 0, blocks); err != nil {
		t.Fatal(err)
	}
	if err := s.Scheduled(req, len(tokens), blocks); err != nil {
		t.Fatal(err)
	}
	meta := s.Plan()
	if err := ws[0].Start(t.Context(), meta); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update([]*connector.Output{ws[0].Poll()}); err != nil {
		t.Fatal(err)
	}
	if keep, err := s.Finish(req, blocks); err != nil || !keep {
		t.Fatalf("Finish = %v, %v; want true", keep, err)
	}
	params, err := s.TransferParams("r")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("PARAMS %s\n", params)
	io.Copy(io.Discard, os.Stdin)
}

// BenchmarkCrossProcess measures the consumer worker's read path across
// processes: the producer runs in a child process (TestBenchProducer) and
// holds an offer of 16 blocks of 2 MiB; in each iteration this process
// reads them through the worker's load (waiting for the offer word, the
// blocks and their digests in one batch, the offer word again, the done
// notice), verifying and not, and, as the baseline, through a plain
// engine of the same kind (one batch of the same 16 reads of the same
// memory). It reports the bandwidths and the ratio of each load's
// bandwidth to the plain engine's (target >= 0.9 for the unverified load).
// Over shm (all engines with the default copying workers), and over
// mooncake where MOONCAKE_TRANSFER_ENGINE_LIBRARY is set (its engines
// configured from the environment, MOONCAKE_LOCAL_HOSTNAME 127.0.0.1 when
// unset).
func BenchmarkCrossProcess(b *testing.B) {
	for _, kind := range []string{TransferShm, TransferMooncake} {
		b.Run(kind, func(b *testing.B) {
			if kind == TransferMooncake {
				if os.Getenv(mooncake.EnvLibrary) == "" {
					b.Skipf("no real Mooncake Transfer Engine: set %s to a libtransfer_engine.so to run this", mooncake.EnvLibrary)
				}
				if os.Getenv(mooncake.EnvLocalHostname) == "" {
					b.Setenv(mooncake.EnvLocalHostname, "127.0.0.1")
				}
			}
			benchCrossProcess(b, kind)
		})
	}
}

func benchCrossProcess(b *testing.B, kind string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchProducer$", "-test.bench=^$", "-test.count=1", "-test.v=false")
	cmd.Env = append(os.Environ(), benchProducerEnv+"="+kind)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("producer process: %v", err)
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(outp)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if p, ok := strings.CutPrefix(sc.Text(), "PARAMS "); ok {
				lines <- p
			}
		}
		close(lines)
	}()
	var raw []byte
	select {
	case l, ok := <-lines:
		if !ok {
			b.Fatal("the producer process ended without its transfer parameters")
		}
		raw = []byte(l)
	case <-time.After(time.Minute):
		b.Fatal("waited a minute for the producer process's transfer parameters")
	}
	pp, err := DecodeParams(raw)
	if err != nil {
		b.Fatal(err)
	}
	plan := &loadPlan{params: pp, remote: pp.Blocks[:benchBlocks]}
	blocks := pp.Blocks[:benchBlocks] // the consumers' blocks: the same ids

	consumer := func(verify string) (*Worker, hostMem) {
		e, alloc, err := benchEngine(kind)
		if err != nil {
			b.Fatal(err)
		}
		m, err := alloc((benchBlocks + 1) * benchBlockBytes)
		if err != nil {
			b.Fatal(err)
		}
		cfg := connector.Config{Connector: Name, Role: connector.RoleConsumer, EngineID: "bench-decode-" + verify, Extra: map[string]any{"verify": verify}}
		s, ws, err := New(cfg, connector.Env{Identity: benchIdentity()}, e)
		if err != nil {
			b.Fatal(err)
		}
		if err := ws[0].Register(benchCache(m)); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			for _, f := range []func() error{ws[0].Close, s.Close, e.Close, m.Free} {
				if err := f(); err != nil {
					b.Error(err)
				}
			}
		})
		return ws[0], m
	}
	verified, vm := consumer("checksum")
	unverified, um := consumer("none")
	if verified.sums == nil || unverified.sums != nil {
		b.Fatalf("the verifying consumer does not verify, or the other does")
	}

	// The baseline: a plain engine reading the same blocks.
	pe, alloc, err := benchEngine(kind)
	if err != nil {
		b.Fatal(err)
	}
	pm, err := alloc(benchBlocks * benchBlockBytes)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, f := range []func() error{pe.Close, pm.Free} {
			if err := f(); err != nil {
				b.Error(err)
			}
		}
	})
	if err := pe.Register(pm.Region()); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seg, err := pe.Open(ctx, pp.Ranks[0].Segment)
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]rdma.Request, benchBlocks)
	for i := range reqs {
		local, err := pm.Region().Sub(i*benchBlockBytes, benchBlockBytes)
		if err != nil {
			b.Fatal(err)
		}
		reqs[i] = rdma.Request{Op: rdma.Read, Local: local, Segment: seg, Remote: uintptr(pp.Ranks[0].Regions[0]) + uintptr(int(pp.Blocks[i])*benchBlockBytes)}
	}
	plain := func() time.Duration {
		start := time.Now()
		batch, err := pe.NewBatch(benchBlocks)
		if err != nil {
			b.Fatal(err)
		}
		if err := batch.Submit(reqs); err != nil {
			b.Fatal(err)
		}
		if err := batch.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		for i := range benchBlocks {
			if r := batch.Result(i); r.Status != rdma.Completed {
				b.Fatalf("request %d = %+v", i, r)
			}
		}
		if err := batch.Release(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	load := func(w *Worker) time.Duration {
		start := time.Now()
		failures, n, stuck := w.read(1, blocks, plan, 0)
		d := time.Since(start)
		if len(failures) > 0 || stuck || n != benchBlocks*benchBlockBytes {
			b.Fatalf("load: failures %+v, %d bytes, stuck %v", failures, n, stuck)
		}
		return d
	}
	// Once before timing: the segments open and the producer arms the offer.
	load(verified)
	load(unverified)
	plain()
	for _, m := range []hostMem{vm, um} {
		if !bytes.Equal(m.Bytes()[:benchBlocks*benchBlockBytes], pm.Bytes()) {
			b.Fatal("a consumer's blocks differ from the plain engine's read of them")
		}
	}
	for i, c := range pm.Bytes() {
		if c != benchByte(i) {
			b.Fatalf("byte %d read = %#x, want %#x", i, c, benchByte(i))
		}
	}

	var tv, tu, tp time.Duration
	// An iteration moves the offer three times: no b.SetBytes, the
	// metrics give each way's bandwidth.
	for b.Loop() {
		tp += plain()
		tu += load(unverified)
		tv += load(verified)
	}
	gbs := func(d time.Duration) float64 {
		return float64(benchBlocks*benchBlockBytes) * float64(b.N) / d.Seconds() / 1e9
	}
	b.ReportMetric(gbs(tp), "engine-GB/s")
	b.ReportMetric(gbs(tu), "p2p-GB/s")
	b.ReportMetric(gbs(tv), "p2p-verified-GB/s")
	b.ReportMetric(tp.Seconds()/tu.Seconds(), "p2p/engine")
	b.ReportMetric(tp.Seconds()/tv.Seconds(), "p2p-verified/engine")
}
