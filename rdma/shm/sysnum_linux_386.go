package shm

// sysMemfdCreate is memfd_create's system call number; package syscall,
// frozen before the call existed, lacks it on this architecture.
const sysMemfdCreate = 356
