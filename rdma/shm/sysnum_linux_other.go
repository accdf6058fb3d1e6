//go:build linux && !(amd64 || 386 || arm || ppc64 || ppc64le || mips || mipsle)

package shm

import "syscall"

// sysMemfdCreate is memfd_create's system call number.
const sysMemfdCreate = syscall.SYS_MEMFD_CREATE
