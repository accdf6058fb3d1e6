package connectortest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// consumerEnv holds, in a consumer process of Options.ConsumerProcess,
// the name of the test whose Run serves the consumer.
const consumerEnv = "KVCONNECT_CONNECTORTEST_CONSUMER"

// processLine prefixes the lines of the protocol between the processes on
// the consumer process's stdout, which the test framework writes to too.
const processLine = "CONNECTORTEST "

// processCase is what the consumer process gets: its engine's spec and
// the producer's offers to hand on, in order.
type processCase struct {
	Tenant string           `json:"tenant"`
	Order  connector.Order  `json:"order"`
	TP     int              `json:"tp"`
	Repl   int              `json:"repl"`
	BS     int              `json:"bs"`
	Blocks int              `json:"blocks"`
	Policy connector.Policy `json:"policy"`
	Offers []processOffer   `json:"offers"`
}

type processOffer struct {
	Prompt []hashing.Token `json:"prompt"`
	Params []byte          `json:"params"`
	Decode int             `json:"decode"`
}

// processResult is what the consumer process reports once its engine
// drained and closed, every check passed.
type processResult struct {
	Hits   int `json:"hits"`   // blocks matched beyond the local hit
	Local  int `json:"local"`  // blocks of the local hits
	Loads  int `json:"loads"`  // loads reported loaded
	Failed int `json:"failed"` // loads reported failed
}

// servesConsumer reports whether this process is a consumer process of
// the Run of test name.
func servesConsumer(name string) (serve, other bool) {
	v := os.Getenv(consumerEnv)
	return v != "" && v == name, v != "" && v != name
}

// runCrossProcess runs the CrossProcess subtests: handoffs to a consumer
// in a child process.
func runCrossProcess(t *testing.T, open OpenFunc, opts Options) {
	name := t.Name()
	t.Run("CrossProcess", func(t *testing.T) {
		for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
			for _, tp := range [][2]int{{1, 1}, {2, 1}, {2, 2}} {
				t.Run(fmt.Sprintf("%v/tp%d-repl%d", order, tp[0], tp[1]), func(t *testing.T) {
					crossHandoff(t, name, open, opts, order, tp[0], tp[1])
				})
			}
		}
		t.Run("WrongParams", func(t *testing.T) { crossWrongParams(t, name, open, opts) })
	})
}

// crossWrongParams is WrongParams across processes: a consumer process is
// handed, for one prompt, every kind of tampered parameters (paramLies),
// and must load nothing; a second one is then handed the genuine
// parameters of two prompts, and loads both.
func crossWrongParams(t *testing.T, name string, open OpenFunc, opts Options) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	s := spec{label: "p", open: open, tenant: "tenant0", order: connector.BlockMajor, tp: 2, repl: 1, bs: bs, blocks: 64, policy: connector.PolicyRecompute}
	prod := w.open(s)
	if _, ok := prod.pair.Planner.(connector.TransferParamsSource); !ok {
		t.Fatalf("the producer's scheduler half does not implement connector.TransferParamsSource")
	}
	o := s
	o.label, o.tenant = "p-other", "tenant1"
	other := w.open(o)
	a, b := testPrompt(6*bs, 31000), testPrompt(6*bs, 32000)
	prod.add(a, 0)
	prod.add(b, 0)
	other.add(a, 0)
	w.offersOf(2, prod)
	w.offersOf(1, other)
	pa, pb := paramsOf(t, prod, a), paramsOf(t, prod, b)
	pc := processCase{Tenant: s.tenant, Order: s.order, TP: s.tp, Repl: s.repl, BS: bs, Blocks: s.blocks, Policy: s.policy}
	var kinds []string
	for _, l := range paramLies {
		tampered, _ := tamper(l, pa, pb, other.offers[0].params)
		for _, p := range tampered {
			pc.Offers = append(pc.Offers, processOffer{Prompt: a, Params: p})
		}
		kinds = append(kinds, fmt.Sprintf("%d %s", len(tampered), l))
	}
	res := startConsumer(t, name).run(t, pc)
	if res.Loads > 0 {
		t.Fatalf("the consumer process loaded %d of the requests of one prompt it was handed tampered parameters for (%s): parameters a client may have forged load nothing but the blocks their producer offered for them, never another request's, and a load of tampered ones fails", res.Loads, strings.Join(kinds, ", "))
	}
	pc.Offers = []processOffer{{Prompt: a, Params: pa}, {Prompt: b, Params: pb}}
	res = startConsumer(t, name).run(t, pc)
	if res.Hits != 10 || res.Loads != 2 || res.Failed > 0 {
		t.Fatalf("the consumer process matched %d blocks of two 6-block prompts handed their genuine parameters (after the tampered ones), with %d loads done and %d failed; want 10 blocks (all but the block with each last token), 2 loads, none failed", res.Hits, res.Loads, res.Failed)
	}
	prod.offers = prod.offers[:0]
	start := time.Now()
	var pa2 pause
	for prod.busy() {
		if prod.step(context.Background(), 0) {
			pa2.reset()
			continue
		}
		if time.Since(start) > waitBound {
			w.gaveUp("waited %v for the producer to release the blocks of offers the consumer process was done with: %s", waitBound, prod.describe())
		}
		pa2.sleep()
	}
	w.finish()
}

// crossHandoff prefills prompts on a producer in this process and hands
// them on, as transfer parameters through a pipe, to a consumer engine
// that the Run of test name drives in a child process of the test binary.
// The child checks every loaded block and reports the matches; this
// process then waits for the producer to release the offers.
func crossHandoff(t *testing.T, name string, open OpenFunc, opts Options, order connector.Order, tp, repl int) {
	w := newWorld(t, opts, new(counts))
	defer w.close()
	const bs = 4
	s := spec{label: "p", open: open, tenant: "tenant0", order: order, tp: tp, repl: repl, bs: bs, blocks: 64, policy: connector.PolicyRecompute}
	c := startConsumer(t, name)
	prod := w.open(s)
	if _, ok := prod.pair.Planner.(connector.TransferParamsSource); !ok {
		t.Fatalf("the producer's scheduler half does not implement connector.TransferParamsSource")
	}
	// Two prompts sharing their first three blocks: the consumer loads 5
	// blocks of the first, and 4 of the second, beyond its local hit of
	// the first's blocks it loaded (its prefix cache may keep them).
	first := testPrompt(6*bs, 2000)
	second := append(first[:3*bs:3*bs], testPrompt(2*bs+2, 5000)...)
	prompts := [][]hashing.Token{first, second}
	for _, p := range prompts {
		prod.add(p, 0)
	}
	start := time.Now()
	var pa pause
	for len(prod.offers) < len(prompts) {
		if len(prod.reqs) == 0 {
			t.Fatalf("the producer finished %d prompts and offered %d of them: each must be kept and get transfer parameters", len(prompts), len(prod.offers))
		}
		if prod.step(context.Background(), 0) {
			pa.reset()
			continue
		}
		if time.Since(start) > waitBound {
			w.gaveUp("waited %v for the producer to finish its prompts: %s", waitBound, prod.describe())
		}
		pa.sleep()
	}
	pc := processCase{Tenant: s.tenant, Order: order, TP: tp, Repl: repl, BS: bs, Blocks: s.blocks, Policy: s.policy}
	for _, o := range prod.offers {
		pc.Offers = append(pc.Offers, processOffer{Prompt: o.prompt, Params: o.params, Decode: 2})
	}
	prod.offers = prod.offers[:0]
	res := c.run(t, pc)
	t.Logf("consumer process %d: %d blocks matched after local hits of %d, %d loads", c.cmd.Process.Pid, res.Hits, res.Local, res.Loads)
	// The second prompt's first three blocks may be a local hit of the
	// first's, loaded already: the match then covers only the rest.
	if got := res.Hits + res.Local; got != 5+5 || res.Failed > 0 {
		t.Fatalf("the consumer process matched %d blocks of the prompts handed on, after local hits of %d, with %d loads failed; want 10 blocks in all (5 of each prompt: all but the block with its last token) and none failed", res.Hits, res.Local, res.Failed)
	}
	if res.Loads != len(prompts) {
		t.Errorf("the consumer process finished %d loads, want %d", res.Loads, len(prompts))
	}
	// The consumer is done: the producer must let the blocks go.
	start = time.Now()
	pa.reset()
	for prod.busy() {
		if prod.step(context.Background(), 0) {
			pa.reset()
			continue
		}
		if time.Since(start) > waitBound {
			w.gaveUp("waited %v for the producer to release the blocks of offers the consumer process was done with: %s", waitBound, prod.describe())
		}
		pa.sleep()
	}
	w.finish()
}

// serveConsumer is the consumer process's Run: it reads a case from
// stdin, drives its engine over the pairs of opts.OpenConsumer, and
// writes the result to stdout.
func serveConsumer(t *testing.T, opts Options) {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		t.Fatalf("consumer process: read the case: %v", err)
	}
	var pc processCase
	if err := json.Unmarshal(line, &pc); err != nil {
		t.Fatalf("consumer process: the case: %v", err)
	}
	w := newWorld(t, opts, new(counts))
	defer w.close()
	cons := w.open(spec{label: "c", open: opts.OpenConsumer, tenant: pc.Tenant, order: pc.Order, tp: pc.TP, repl: pc.Repl, bs: pc.BS, blocks: pc.Blocks, policy: pc.Policy})
	for _, o := range pc.Offers {
		cons.addWith(o.Prompt, o.Decode, o.Params)
	}
	w.drain(cons)
	res := processResult{Hits: cons.stats.externalHits, Local: cons.stats.localHits, Loads: cons.stats.loads, Failed: cons.stats.failedLoads}
	w.finish()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("%s%s\n", processLine, b)
}

// consumerProc is a running consumer process.
type consumerProc struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	msgs chan string // protocol lines
	mu   sync.Mutex
	out  []string // the other lines: the child's test output
	done chan struct{}
}

// runPattern returns the -test.run pattern that selects test name alone.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// startConsumer starts the consumer process for the Run of test name: the
// test binary, running that test alone.
func startConsumer(t *testing.T, name string) *consumerProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run="+runPattern(name), "-test.count=1", "-test.v=false")
	cmd.Env = append(os.Environ(), consumerEnv+"="+name)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = wr, wr
	if err := cmd.Start(); err != nil {
		r.Close()
		wr.Close()
		t.Fatalf("start the consumer process: %v", err)
	}
	wr.Close()
	c := &consumerProc{cmd: cmd, in: in, msgs: make(chan string, 16), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), processLine); ok {
				c.msgs <- l
				continue
			}
			c.mu.Lock()
			c.out = append(c.out, sc.Text())
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		c.in.Close()
		exited := make(chan error, 1)
		go func() { <-c.done; exited <- c.cmd.Wait() }()
		select {
		case <-exited:
		case <-time.After(waitBound):
			c.cmd.Process.Kill()
			<-exited
			t.Errorf("the consumer process did not exit within %v of its stdin closing: killed", waitBound)
		}
	})
	return c
}

// output returns what the consumer process wrote besides the protocol.
func (c *consumerProc) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.out, "\n")
}

// run hands the case to the consumer process and returns its result. The
// process's checks have bounds of their own; this waits for them five
// times waitBound at most.
func (c *consumerProc) run(t *testing.T, pc processCase) processResult {
	t.Helper()
	b, err := json.Marshal(pc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(c.in, "%s\n", b); err != nil {
		t.Fatalf("hand the case to the consumer process: %v", err)
	}
	select {
	case l := <-c.msgs:
		return c.result(t, l)
	case <-c.done:
		select {
		case l := <-c.msgs: // written just before it exited
			return c.result(t, l)
		default:
		}
		t.Fatalf("the consumer process ended without a result:\n%s", c.output())
	case <-time.After(5 * waitBound):
		t.Fatalf("waited %v for the consumer process's result:\n%s", 5*waitBound, c.output())
	}
	return processResult{}
}

func (c *consumerProc) result(t *testing.T, l string) processResult {
	t.Helper()
	var res processResult
	if err := json.Unmarshal([]byte(l), &res); err != nil {
		t.Fatalf("the consumer process's result %q: %v", l, err)
	}
	return res
}
