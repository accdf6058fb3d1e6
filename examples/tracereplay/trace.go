package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// TraceBlock is the number of tokens behind one hash id of a trace in the
// Mooncake format: the last id of a request may cover fewer.
const TraceBlock = 512

// Bounds on a trace line, so that a trace from elsewhere cannot make the
// replay hold unbounded memory: a line of at most maxLine bytes, a prompt
// of at most maxInput tokens, hash ids below maxHashID (so that the token
// ids derived from them fit a hashing.Token).
const (
	maxLine   = 16 << 20
	maxInput  = 1 << 22
	maxOutput = 1 << 22
	maxHashID = 1<<32/TraceBlock - 1
)

// Request is one request of a trace.
type Request struct {
	Line      int     // line number in the trace, from 1
	Timestamp int64   // arrival, in milliseconds from the trace's start
	Input     int     // prompt tokens
	Output    int     // tokens to generate
	HashIDs   []int64 // one per TraceBlock tokens of the prompt, the last one maybe partial
}

// Trace is a parsed trace.
type Trace struct {
	Name     string
	Requests []Request
}

// traceLine is the JSON of one line. Pointers tell a missing field from a
// zero one.
type traceLine struct {
	Timestamp *int64   `json:"timestamp"`
	Input     *int64   `json:"input_length"`
	Output    *int64   `json:"output_length"`
	HashIDs   *[]int64 `json:"hash_ids"`
}

// LineError is a trace line the replay refuses.
type LineError struct {
	Name  string // the trace's file name
	Line  int    // from 1
	Field string // the JSON field, or "" when the line is not a JSON object
	Err   error
}

func (e *LineError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %v", e.Name, e.Line, e.Err)
	}
	return fmt.Sprintf("%s:%d: %s: %v", e.Name, e.Line, e.Field, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }

// ReadTraceFile reads a trace in the Mooncake format from path, gzipped or
// not (told by the gzip magic bytes, not the name).
func ReadTraceFile(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	return ReadTrace(path, f)
}

// ReadTrace reads a trace in the Mooncake format (JSON Lines, one request a
// line, gzipped or not) from r; name names it in errors. Blank lines are
// skipped. Every other line must be a JSON object with timestamp >= 0,
// input_length >= 1, output_length >= 0 and exactly
// ceil(input_length/512) hash_ids, each in [0, 8388606]; the first line
// that is not is an error naming its number and the field.
func ReadTrace(name string, r io.Reader) (*Trace, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("trace %s: gzip: %w", name, err)
		}
		defer zr.Close()
		br = bufio.NewReaderSize(zr, 1<<16)
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 0, 1<<16), maxLine)
	t := &Trace{Name: name}
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		req, err := parseLine(b)
		if err != nil {
			err.Name, err.Line = name, line
			return nil, err
		}
		req.Line = line
		t.Requests = append(t.Requests, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &LineError{Name: name, Line: line + 1, Err: fmt.Errorf("line longer than %d bytes", maxLine)}
		}
		return nil, fmt.Errorf("trace %s: after line %d: %w", name, line, err)
	}
	if len(t.Requests) == 0 {
		return nil, fmt.Errorf("trace %s: no requests", name)
	}
	return t, nil
}

// parseLine checks one line; the caller fills in the error's name and line.
func parseLine(b []byte) (Request, *LineError) {
	var l traceLine
	if err := json.Unmarshal(b, &l); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Request{}, &LineError{Field: te.Field, Err: fmt.Errorf("a JSON %s, want %v", te.Value, te.Type)}
		}
		return Request{}, &LineError{Err: fmt.Errorf("not a JSON object: %v", err)}
	}
	switch {
	case l.Timestamp == nil:
		return Request{}, &LineError{Field: "timestamp", Err: errors.New("missing")}
	case l.Input == nil:
		return Request{}, &LineError{Field: "input_length", Err: errors.New("missing")}
	case l.Output == nil:
		return Request{}, &LineError{Field: "output_length", Err: errors.New("missing")}
	case l.HashIDs == nil:
		return Request{}, &LineError{Field: "hash_ids", Err: errors.New("missing")}
	case *l.Timestamp < 0:
		return Request{}, &LineError{Field: "timestamp", Err: fmt.Errorf("%d, want >= 0", *l.Timestamp)}
	case *l.Input < 1 || *l.Input > maxInput:
		return Request{}, &LineError{Field: "input_length", Err: fmt.Errorf("%d, want 1 to %d", *l.Input, maxInput)}
	case *l.Output < 0 || *l.Output > maxOutput:
		return Request{}, &LineError{Field: "output_length", Err: fmt.Errorf("%d, want 0 to %d", *l.Output, maxOutput)}
	}
	ids := *l.HashIDs
	in := int(*l.Input)
	want := (in + TraceBlock - 1) / TraceBlock
	if len(ids) != want {
		return Request{}, &LineError{Field: "hash_ids", Err: fmt.Errorf("%d ids, want %d: one per %d tokens of input_length %d", len(ids), want, TraceBlock, in)}
	}
	for i, id := range ids {
		if id < 0 || id > maxHashID {
			return Request{}, &LineError{Field: fmt.Sprintf("hash_ids[%d]", i), Err: fmt.Errorf("%d, want 0 to %d", id, maxHashID)}
		}
	}
	return Request{Timestamp: *l.Timestamp, Input: in, Output: int(*l.Output), HashIDs: ids}, nil
}

// TokenAt returns the token at position p of a prompt whose trace blocks
// are ids: a function of the id of the trace block holding p and of p's
// offset in it, so equal ids give equal tokens, and every id its own.
func TokenAt(ids []int64, p int) uint32 {
	return uint32(ids[p/TraceBlock])*TraceBlock + uint32(p%TraceBlock)
}
