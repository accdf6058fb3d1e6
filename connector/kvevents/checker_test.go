package kvevents

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// requireCheckerVar makes TestIndependentConsumer fail, rather than skip,
// when python3 with pyzmq and msgpack is missing.
const requireCheckerVar = "KVEVENTS_CHECKER_REQUIRE"

// pythonVar names a python3 interpreter to use instead of the first of
// python3 (on PATH) and /usr/bin/python3 that imports zmq and msgpack.
const pythonVar = "KVEVENTS_PYTHON"

// checkerPython returns a python3 that imports zmq and msgpack, or skips
// the test saying why (fails it when requireCheckerVar=1).
func checkerPython(t *testing.T) string {
	t.Helper()
	candidates := []string{"python3", "/usr/bin/python3"}
	if p := os.Getenv(pythonVar); p != "" {
		candidates = []string{p}
	}
	var why []string
	for _, c := range candidates {
		path, err := exec.LookPath(c)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v", c, err))
			continue
		}
		out, err := exec.Command(path, "-c", "import zmq, msgpack").CombinedOutput()
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v: %s", path, err, bytes.TrimSpace(out)))
			continue
		}
		return path
	}
	msg := fmt.Sprintf("no python3 with zmq and msgpack (%q); install the Debian packages python3-zmq and python3-msgpack, or set %s", why, pythonVar)
	if os.Getenv(requireCheckerVar) == "1" {
		t.Fatalf("%s, and %s=1", msg, requireCheckerVar)
	}
	t.Skipf("%s; %s=1 makes this a failure", msg, requireCheckerVar)
	return ""
}

// vllmFields are the fields of vLLM's event classes in declaration order.
var vllmFields = map[string][]string{
	"BlockStored": {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
		"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"},
	"BlockRemoved":     {"block_hashes", "medium", "group_idx"},
	"AllBlocksCleared": {},
}

// checkerEvent is an event as check_consumer.py prints it.
func checkerEvent(fields []kv, f Format) map[string]any {
	tag := fields[0].V.(string)
	byName := map[string]any{}
	keys := []any{}
	for _, e := range fields {
		keys = append(keys, e.K)
		byName[e.K] = e.V
	}
	all := map[string]any{}
	for _, n := range vllmFields[tag] {
		all[n] = byName[n] // nil (None) when left out
	}
	ev := map[string]any{"type": tag, "encoding": string(f), "fields": all, "keys": nil}
	if f == FormatMap {
		ev["keys"] = keys
	}
	return ev
}

// jsonValue returns v as JSON decodes it with numbers kept exact.
func jsonValue(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return jsonDecode(t, b)
}

func jsonDecode(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("decode JSON %q: %v", b, err)
	}
	return v
}

// TestIndependentConsumer runs testdata/check_consumer.py, a consumer
// written with pyzmq (libzmq) and msgpack against vLLM's event classes: it
// subscribes, decodes every frame and field, asks for a replay over a
// DEALER socket and prints JSON that is compared here field by field.
func TestIndependentConsumer(t *testing.T) {
	python := checkerPython(t)
	for _, tc := range []struct {
		f      Format
		legacy bool
		bind   bool // the SUB binds and the publisher connects to it
	}{{FormatMap, false, false}, {FormatArray, false, false}, {FormatMap, true, false}, {FormatMap, false, true}} {
		f := tc.f
		name := string(f)
		if tc.legacy {
			name += "/legacy_replay"
		}
		if tc.bind {
			name += "/binding_sub"
		}
		t.Run(name, func(t *testing.T) {
			const topic = "kv@pod-0@llama"
			cfg := Config{Topic: topic, Format: f, DataParallelRank: 2, LegacyReplay: tc.legacy}
			var p *Publisher
			pub, replayArg := "", "-"
			if !tc.bind {
				p = openTest(t, cfg)
				pub, replayArg = p.Endpoint(), p.ReplayEndpoint()
			} else {
				pub = "tcp://127.0.0.1:*"
			}
			args := []string{"testdata/check_consumer.py", "--pub", pub, "--replay", replayArg,
				"--topic", "kv@", "--count", "2", "--replay-from", "0", "--timeout-ms", fmt.Sprint(testTimeout.Milliseconds())}
			if tc.legacy {
				args = append(args, "--legacy-replay")
			}
			if tc.bind {
				args = append(args, "--bind")
			}
			cmd := exec.Command(python, args...)
			var stderr bytes.Buffer
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stdout, cmd.Stderr = pw, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pw.Close()
			lines := make(chan string, 4)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(pr)
				sc.Buffer(nil, 64<<20)
				for sc.Scan() {
					lines <- sc.Text()
				}
			}()
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			if tc.bind {
				var first string
				select {
				case first = <-lines:
				case err := <-exited:
					t.Fatalf("check_consumer.py exited before binding: %v\n%s", err, stderr.String())
				case <-time.After(2 * testTimeout):
					cmd.Process.Kill()
					t.Fatalf("check_consumer.py did not bind\n%s", stderr.String())
				}
				var bound struct{ Bound string }
				if err := json.Unmarshal([]byte(first), &bound); err != nil || bound.Bound == "" {
					t.Fatalf("check_consumer.py's first line %q: want {\"bound\": endpoint}", first)
				}
				cfg.Endpoint = bound.Bound
				p = openTest(t, cfg)
				if p.cfg.Binds() {
					t.Fatalf("the publisher binds %q, want it to connect", cfg.Endpoint)
				}
				fmt.Fprintln(stdin, p.ReplayEndpoint())
			}
			// Wait for the subscription (or for the checker to fail first).
			deadline := time.Now().Add(testTimeout)
			for p.Stats().Subscribers == 0 {
				select {
				case err := <-exited:
					t.Fatalf("check_consumer.py exited before subscribing: %v\n%s", err, stderr.String())
				default:
				}
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					<-exited
					t.Fatalf("check_consumer.py did not subscribe within %v\n%s", testTimeout, stderr.String())
				}
				time.Sleep(time.Millisecond)
			}
			events, want := sampleEvents()
			before := time.Now()
			mustPublish(t, p, events...)
			mustPublish(t, p, events[3])
			after := time.Now()
			select {
			case err := <-exited:
				if err != nil {
					t.Fatalf("check_consumer.py: %v\n%s", err, stderr.String())
				}
			case <-time.After(2 * testTimeout):
				cmd.Process.Kill()
				<-exited
				t.Fatalf("check_consumer.py did not finish\n%s", stderr.String())
			}
			var stdout string
			for l := range lines {
				stdout = l // the last line is the output
			}
			t.Logf("check_consumer.py printed:\n%s", stdout)
			got := jsonDecode(t, []byte(stdout)).(map[string]any)

			batch := func(topic any, seq int, evs [][]kv) map[string]any {
				out := []any{}
				for _, e := range evs {
					out = append(out, checkerEvent(e, f))
				}
				return map[string]any{"topic": topic, "seq": seq, "dp_rank": 2, "events": out}
			}
			wantOut := map[string]any{
				"live":   []any{batch(topic, 0, want), batch(topic, 1, want[3:])},
				"replay": []any{batch(topic, 0, want), batch(topic, 1, want[3:])},
				"end":    []any{"", "", "ffffffffffffffff", ""},
			}
			if tc.legacy {
				wantOut["replay"] = []any{batch(nil, 0, want), batch(nil, 1, want[3:])}
				wantOut["end"] = []any{"", "ffffffffffffffff", ""}
			}
			// The timestamps: floats between before and after; then out of
			// the comparison.
			for _, part := range []string{"live", "replay"} {
				rows, _ := got[part].([]any)
				for i, r := range rows {
					row := r.(map[string]any)
					ts, err := strconv.ParseFloat(fmt.Sprint(row["ts"]), 64)
					if err != nil || ts < float64(before.UnixNano())/1e9-1e-3 || ts > float64(after.UnixNano())/1e9+1e-3 {
						t.Errorf("%s[%d].ts = %v, want between %v and %v", part, i, row["ts"], before, after)
					}
					delete(row, "ts")
				}
			}
			if diff := cmp.Diff(jsonValue(t, wantOut), any(got)); diff != "" {
				t.Errorf("check_consumer.py output (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCheckerRejectsOtherReplayForm: check_consumer.py fails on the replay
// form it was not told to expect, as llm-d-router v0.10.0 fails on the
// form before vLLM 0.26: its replay check can fail.
func TestCheckerRejectsOtherReplayForm(t *testing.T) {
	python := checkerPython(t)
	for _, tc := range []struct {
		legacyPub, legacyChecker bool
		want                     string
	}{
		{true, false, "malformed replay frame with 2 frames"},
		{false, true, "legacy replay reply of 3 frames"},
	} {
		t.Run(fmt.Sprintf("publisher_legacy=%v", tc.legacyPub), func(t *testing.T) {
			p := openTest(t, Config{Topic: "kv@pod@m", LegacyReplay: tc.legacyPub})
			args := []string{"testdata/check_consumer.py", "--pub", p.Endpoint(), "--replay", p.ReplayEndpoint(),
				"--count", "1", "--timeout-ms", fmt.Sprint(testTimeout.Milliseconds())}
			if tc.legacyChecker {
				args = append(args, "--legacy-replay")
			}
			cmd := exec.Command(python, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			deadline := time.Now().Add(testTimeout)
			for p.Stats().Subscribers == 0 {
				select {
				case err := <-exited:
					t.Fatalf("check_consumer.py exited before subscribing: %v\n%s", err, stderr.String())
				default:
				}
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					<-exited
					t.Fatalf("check_consumer.py did not subscribe within %v", testTimeout)
				}
				time.Sleep(time.Millisecond)
			}
			mustPublish(t, p, Event{Kind: AllBlocksCleared})
			var err error
			select {
			case err = <-exited:
			case <-time.After(2 * testTimeout):
				cmd.Process.Kill()
				<-exited
				t.Fatalf("check_consumer.py did not finish\n%s", stderr.String())
			}
			if err == nil || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("check_consumer.py = %v, stderr %q; want a failure saying %q", err, stderr.String(), tc.want)
			}
		})
	}
}
