//go:build linux

// Package shmfiles finds the memory files of rdma/shm that processes
// hold, for the tests that check none is left behind.
package shmfiles

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Of returns the lines of /proc/*/maps and the /proc/*/fd links, of every
// process this user can read, that name an rdma/shm memory file of
// process pid ("memfd:kvconnect-shm-<pid> ..."): a mapping or an open
// descriptor of it.
func Of(pid int) ([]string, error) {
	name := fmt.Sprintf("memfd:kvconnect-shm-%d ", pid)
	var out []string
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return nil, err
	}
	for _, d := range dirs {
		if maps, err := os.ReadFile(d + "/maps"); err == nil {
			for l := range strings.Lines(string(maps)) {
				if strings.Contains(l, name) {
					out = append(out, d+"/maps: "+strings.TrimSpace(l))
				}
			}
		}
		fds, _ := filepath.Glob(d + "/fd/*") // unreadable folders: other users'
		for _, fd := range fds {
			if l, err := os.Readlink(fd); err == nil && strings.HasPrefix(l+" ", "/"+name) {
				out = append(out, fd+" -> "+l)
			}
		}
	}
	return out, nil
}
