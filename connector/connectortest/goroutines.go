package connectortest

import (
	"bytes"
	"reflect"
	"runtime"
	"strconv"
	"strings"
)

// goroutine is one entry of a goroutine dump.
type goroutine struct {
	id      uint64
	state   string // "chan receive", "runnable", ...
	creator uint64 // the goroutine that started it; 0 if unknown
	stack   string
}

// dump returns every goroutine's stack.
func dump() []goroutine {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var gs []goroutine
	for _, rec := range bytes.Split(buf, []byte("\n\n")) {
		if g, ok := parseGoroutine(string(rec)); ok {
			gs = append(gs, g)
		}
	}
	return gs
}

// parseGoroutine parses one record of runtime.Stack: a header
// "goroutine 18 [chan receive, 2 minutes]:", frames, and a last
// "created by f in goroutine 7".
func parseGoroutine(rec string) (goroutine, bool) {
	rest, ok := strings.CutPrefix(rec, "goroutine ")
	if !ok {
		return goroutine{}, false
	}
	idText, rest, ok := strings.Cut(rest, " [")
	if !ok {
		return goroutine{}, false
	}
	id, err := strconv.ParseUint(idText, 10, 64)
	if err != nil {
		return goroutine{}, false
	}
	state, _, _ := strings.Cut(rest, "]")
	state, _, _ = strings.Cut(state, ",")
	g := goroutine{id: id, state: state, stack: rec}
	if i := strings.LastIndex(rec, "\ncreated by "); i >= 0 {
		line, _, _ := strings.Cut(rec[i+1:], "\n")
		if j := strings.LastIndex(line, " in goroutine "); j >= 0 {
			g.creator, _ = strconv.ParseUint(line[j+len(" in goroutine "):], 10, 64)
		}
	}
	return g, true
}

// currentGoroutine returns the id of the calling goroutine.
func currentGoroutine() uint64 {
	var buf [64]byte
	g, _ := parseGoroutine(string(buf[:runtime.Stack(buf[:], false)]))
	return g.id
}

// blocked reports whether a goroutine in state waits for something that
// no one is bound to provide: a channel, a select, a condition, a timer,
// I/O or a WaitGroup. A goroutine on its way out after its owner's Close
// returned is running or runnable, never in one of these.
func blocked(state string) bool {
	for _, s := range []string{"chan ", "select", "sync.Cond.Wait", "sleep", "IO wait", "sync.WaitGroup.Wait"} {
		if strings.HasPrefix(state, s) {
			return true
		}
	}
	return false
}

// waitsOn reports whether goroutine id exists and waits for something
// (it is neither running, nor runnable, nor in a system call).
func waitsOn(id uint64) bool {
	for _, g := range dump() {
		if g.id == id {
			return g.state != "running" && g.state != "runnable" && g.state != "syscall"
		}
	}
	return false
}

// packageOf returns the import path of the package that defines v's type
// (or the type it points to), or "".
func packageOf(v any) string {
	t := reflect.TypeOf(v)
	if t == nil {
		return ""
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath()
}

// leftovers returns the goroutines that the case started, directly (from
// goroutine gid) or through goroutines it started, that did not exist
// before (before), and whose stack runs code of one of pkgs.
func leftovers(gid uint64, before map[uint64]bool, pkgs []string) []goroutine {
	gs := dump()
	byID := make(map[uint64]*goroutine, len(gs))
	for i := range gs {
		byID[gs[i].id] = &gs[i]
	}
	// ours reports whether g descends from gid through goroutines alive
	// now; one whose ancestors ended cannot be told apart from another
	// test's, and is left out.
	var ours func(g *goroutine, depth int) bool
	ours = func(g *goroutine, depth int) bool {
		switch {
		case g.creator == gid:
			return true
		case depth > 64 || g.creator == 0 || before[g.creator]:
			return false
		}
		p := byID[g.creator]
		return p != nil && ours(p, depth+1)
	}
	var left []goroutine
	for i := range gs {
		g := &gs[i]
		if g.id == gid || before[g.id] || !ours(g, 0) || !runsCodeOf(g.stack, pkgs) {
			continue
		}
		left = append(left, *g)
	}
	return left
}

// runsCodeOf reports whether a stack has a frame (or its creator) in one
// of pkgs.
func runsCodeOf(stack string, pkgs []string) bool {
	for _, line := range strings.Split(stack, "\n") {
		line = strings.TrimPrefix(line, "created by ")
		for _, p := range pkgs {
			if rest, ok := strings.CutPrefix(line, p); ok && strings.HasPrefix(rest, ".") {
				return true
			}
		}
	}
	return false
}

// snapshot returns the ids of the goroutines alive now.
func snapshot() map[uint64]bool {
	m := make(map[uint64]bool)
	for _, g := range dump() {
		m[g.id] = true
	}
	return m
}
