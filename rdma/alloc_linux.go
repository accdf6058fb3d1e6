package rdma

import "syscall"

// hugePage is the size of a transparent huge page on the platforms Linux
// runs KV engines on.
const hugePage = 2 << 20

// advise asks the kernel to back a mapping of at least one huge page with
// transparent huge pages: KV memory is large and streamed, and a huge page
// is one page fault and one TLB entry where small pages take 512. Where
// the kernel refuses (transparent huge pages "never"), the mapping keeps
// small pages: the advice is only advice.
func advise(mem []byte) {
	if len(mem) >= hugePage {
		if err := syscall.Madvise(mem, syscall.MADV_HUGEPAGE); err != nil {
			return // EINVAL where the kernel has no transparent huge pages: small pages
		}
	}
}
