package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// child is a process of this binary that the mini-engine started: an
// instance of -pd across processes, or a rank of -tp-procs.
type child struct {
	cmd    *exec.Cmd
	stderr *lockedBuffer
	exited chan struct{} // closed once cmd.Wait returned
	err    error         // cmd.Wait's, once exited
}

// startChild starts exe with this process's environment and env, keeping
// what it writes on stderr, and reaps it when it ends.
func startChild(exe string, env ...string) (*child, error) {
	c := &child{cmd: exec.Command(exe), stderr: &lockedBuffer{}, exited: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stderr = c.stderr
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// pid returns the process's id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// said returns what the process wrote on stderr, for errors: "" or
// " (stderr: ...)".
func (c *child) said() string {
	if out := strings.TrimSpace(c.stderr.String()); out != "" {
		return fmt.Sprintf(" (stderr: %s)", out)
	}
	return ""
}

// endWithin waits up to wait for the process to end, then kills it, and
// returns once it has been reaped.
func (c *child) endWithin(wait time.Duration) {
	select {
	case <-c.exited:
	case <-time.After(wait):
		c.cmd.Process.Kill()
		<-c.exited
	}
}

// lockedBuffer collects a child process's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
