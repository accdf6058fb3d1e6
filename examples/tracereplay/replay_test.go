package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// replayFile runs the command on a trace file with args and returns its
// JSON report.
func replayFile(t *testing.T, trace string, args ...string) *Report {
	t.Helper()
	var out, errw bytes.Buffer
	args = append(append([]string{"-json", "-plot", ""}, args...), trace)
	if err := Main(context.Background(), args, &out, &errw); err != nil {
		t.Fatalf("tracereplay %s: %v\n%s", strings.Join(args, " "), err, errw.String())
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, out.String())
	}
	return &rep
}

// tokens are the figures of a run, in tokens, for comparison.
type tokens struct {
	Input, Local, External, Computed int64
}

func figures(r *Result) tokens {
	return tokens{r.InputTokens, r.LocalTokens, r.ExternalTokens, r.ComputedTokens}
}

// TestSharedPrefixes replays four requests over two instances, round-robin
// (A, B, A, B), at 256-token blocks with unbounded capacity. By hand, with
// a block reusable when its prefix was computed before, never the block of
// the last prompt token, never a partial block:
//
//	1 ids [1 2] 1024 tokens on A: nothing before it                  0
//	2 ids [1 3] 1024 on B: blocks 0, 1 (id 1) from the store      512 external
//	3 ids [1 2] 1024 on A: blocks 0-2 from A's own cache (3 holds
//	  the last token)                                              768 local
//	4 ids [1 2] 700 on B: 2 full blocks, both in B's cache (loaded
//	  for request 2)                                               512 local
//
// 1,792 of 3,772 tokens reused, the theoretical maximum.
func TestSharedPrefixes(t *testing.T) {
	rep := replayFile(t, filepath.Join("testdata", "small_shared.jsonl"), "-block", "256", "-instances", "2", "-capacity", "unbounded", "-pool", "4096")
	want := Bound{BlockSize: 256, Requests: 4, InputTokens: 3772, HitTokens: 1792, Keys: 6}
	if diff := cmp.Diff(want, rep.Bound); diff != "" {
		t.Errorf("bound (-want +got):\n%s", diff)
	}
	if len(rep.Runs) != 1 {
		t.Fatalf("%d runs, want 1", len(rep.Runs))
	}
	r := rep.Runs[0]
	if diff := cmp.Diff(tokens{Input: 3772, Local: 1280, External: 512, Computed: 3772 - 1792}, figures(r)); diff != "" {
		t.Errorf("run (-want +got):\n%s", diff)
	}
	if r.HitRate != rep.Bound.HitRate() {
		t.Errorf("hit rate %v, want the theoretical maximum %v", r.HitRate, rep.Bound.HitRate())
	}
	// Off, each instance reuses only what it computed: request 3 the 768
	// tokens of request 1 on A, request 4 the 512 of request 2 on B.
	if want := int64(3772 - 768 - 512); rep.OffComputed != want {
		t.Errorf("tokens computed with the connector off = %d, want %d", rep.OffComputed, want)
	}
	if r.VerifiedBlocks != 7 {
		t.Errorf("verified %d reused blocks, want 7 (2 + 3 + 2)", r.VerifiedBlocks)
	}
}

// TestEviction replays six requests of 512 tokens (2 blocks of 256, the
// first reusable) each on an instance of its own, so that every reuse comes
// from the store, which holds 4 blocks and evicts the least recently used:
//
//	1 id 1: store 1a 1b                                  0
//	2 id 2: store 1a 1b 2a 2b                            0
//	3 id 3: 1a, 1b evicted: 2a 2b 3a 3b                  0
//	4 id 1: 1a gone; its saves evict 2a 2b: 3a 3b 1a 1b  0
//	5 id 3: 3a present                                 256 external
//	6 id 2: 2a gone                                      0
//
// Unbounded, requests 4, 5 and 6 each reuse their first block: 768.
func TestEviction(t *testing.T) {
	trace := filepath.Join("testdata", "small_evict.jsonl")
	args := []string{"-block", "256", "-kv-bytes", "16", "-instances", "6", "-pool", "1024"}
	rep := replayFile(t, trace, append(args, "-capacity", "1024,unbounded")...)
	if got, want := rep.Bound.HitTokens, int64(768); got != want {
		t.Errorf("bound: %d tokens reusable, want %d", got, want)
	}
	if len(rep.Runs) != 2 {
		t.Fatalf("%d runs, want 2", len(rep.Runs))
	}
	if diff := cmp.Diff(tokens{Input: 3072, External: 256, Computed: 3072 - 256}, figures(rep.Runs[0])); diff != "" {
		t.Errorf("capacity 1024 tokens (-want +got):\n%s", diff)
	}
	if rep.Runs[0].Evictions == 0 {
		t.Error("capacity 1024 tokens: no eviction")
	}
	if diff := cmp.Diff(tokens{Input: 3072, External: 768, Computed: 3072 - 768}, figures(rep.Runs[1])); diff != "" {
		t.Errorf("unbounded (-want +got):\n%s", diff)
	}
}

// TestUnboundedReachesBound replays the first requests of the conversation
// trace over two instances with unbounded capacity: every block an earlier
// request computed is in the store or a local cache, so the replay's total
// hit rate is exactly the theoretical maximum computed from the trace.
func TestUnboundedReachesBound(t *testing.T) {
	for _, route := range Routes {
		t.Run(route, func(t *testing.T) {
			rep := replayFile(t, filepath.Join("testdata", "conversation_trace.jsonl.gz"),
				"-requests", "120", "-block", "64", "-instances", "2", "-route", route, "-capacity", "unbounded", "-off=false")
			r := rep.Runs[0]
			if r.LocalTokens+r.ExternalTokens != rep.Bound.HitTokens {
				t.Errorf("reused %d local + %d external = %d tokens, want the bound's %d", r.LocalTokens, r.ExternalTokens, r.LocalTokens+r.ExternalTokens, rep.Bound.HitTokens)
			}
			if rep.Bound.HitTokens == 0 {
				t.Error("the sample reuses nothing: the check cannot fail")
			}
			// Round-robin splits conversations between the instances, so
			// some reuse must come through the store.
			if route == "round-robin" && r.ExternalTokens == 0 {
				t.Error("round-robin: nothing loaded from the store")
			}
			if r.Requests != 120 || r.InputTokens != rep.Bound.InputTokens {
				t.Errorf("replayed %d requests, %d tokens; want 120, %d", r.Requests, r.InputTokens, rep.Bound.InputTokens)
			}
		})
	}
}

// TestBadInput checks that each bad trace line or flag is refused with an
// error naming the line and field, or the flag, before anything runs.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	good := `{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing file", []string{filepath.Join(dir, "nope.jsonl")}, "nope.jsonl: no such file"},
		{"not JSON", []string{write("a.jsonl", good+"\nthis is not json\n")}, "a.jsonl:2: not a JSON object"},
		{"negative length", []string{write("b.jsonl", good+"\n"+`{"timestamp": 1, "input_length": -5, "output_length": 1, "hash_ids": []}`)}, "b.jsonl:2: input_length: -5, want 1 to"},
		{"too many ids", []string{write("c.jsonl", `{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [1, 2]}`)}, "c.jsonl:1: hash_ids: 2 ids, want 1: one per 512 tokens of input_length 512"},
		{"too few ids", []string{write("d.jsonl", good+"\n"+good+"\n"+`{"timestamp": 1, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}`)}, "d.jsonl:3: hash_ids: 2 ids, want 3"},
		{"negative id", []string{write("e.jsonl", `{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [-1]}`)}, "e.jsonl:1: hash_ids[0]: -1, want 0 to"},
		{"missing field", []string{write("f.jsonl", `{"timestamp": 1, "input_length": 10, "hash_ids": [1]}`)}, "f.jsonl:1: output_length: missing"},
		{"wrong type", []string{write("g.jsonl", `{"timestamp": 1, "input_length": "ten", "output_length": 1, "hash_ids": [1]}`)}, "g.jsonl:1: input_length: a JSON string, want int64"},
		{"empty", []string{write("h.jsonl", "\n\n")}, "no requests"},
		{"block not dividing 512", []string{"-block", "100", write("i.jsonl", good)}, "-block = 100, want a divisor of 512"},
		{"capacity 0", []string{"-capacity", "0", write("j.jsonl", good)}, `-capacity: "0", want a number of tokens above 0`},
		{"capacity negative", []string{"-capacity", "1M,-3", write("k.jsonl", good)}, `-capacity: "-3"`},
		{"pool too small", []string{"-pool", "512", write("l.jsonl", good)}, "-pool = 512 tokens: the trace's line 1 has a prompt of 600 tokens"},
		{"no trace", nil, "want one trace file argument, got 0"},
		{"unknown store", []string{"-store", "disk", write("m.jsonl", good)}, `-store = "disk"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errw bytes.Buffer
			err := Main(context.Background(), append([]string{"-plot", ""}, tc.args...), &out, &errw)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Main(%q) = %v, want an error containing %q", tc.args, err, tc.want)
			}
			if out.Len() != 0 {
				t.Errorf("Main(%q) printed a report after an error:\n%s", tc.args, out.String())
			}
		})
	}
	var le *LineError
	_, err := ReadTraceFile(write("z.jsonl", good+"\n[1,2]\n"))
	if !errors.As(err, &le) || le.Line != 2 {
		t.Errorf("ReadTraceFile of a bad line 2 = %v, want a *LineError of line 2", err)
	}
}

// FuzzReadTrace feeds arbitrary bytes to the trace reader: it returns a
// trace whose every request is consistent, or an error; it never panics.
func FuzzReadTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}`))
	f.Add([]byte("{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": [0]}\n\n{}"))
	f.Add([]byte{0x1f, 0x8b, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := ReadTrace("fuzz", bytes.NewReader(data))
		if err != nil {
			return
		}
		for _, r := range tr.Requests {
			if r.Input < 1 || len(r.HashIDs) != (r.Input+TraceBlock-1)/TraceBlock || r.Output < 0 || r.Timestamp < 0 {
				t.Fatalf("accepted an inconsistent request: %+v", r)
			}
			for _, id := range r.HashIDs {
				if id < 0 || id > maxHashID {
					t.Fatalf("accepted hash id %d", id)
				}
			}
		}
	})
}

// TestPlot: the chart is well-formed XML with a point per bounded
// capacity in each of its two series (the unbounded run is the maximum's
// line, not a point).
func TestPlot(t *testing.T) {
	rep := replayFile(t, filepath.Join("testdata", "small_evict.jsonl"), "-block", "256", "-kv-bytes", "16", "-instances", "6", "-pool", "1024", "-capacity", "512,1024,unbounded", "-off=false")
	svg := Plot(rep)
	dec := xml.NewDecoder(strings.NewReader(svg))
	circles := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Plot is not well-formed XML: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "circle" {
			circles++
		}
	}
	if circles != 4 {
		t.Errorf("Plot has %d points, want 4 (2 capacities x 2 series)", circles)
	}
}
