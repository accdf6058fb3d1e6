package cudart

import (
	"path/filepath"

	"github.com/kvconnect/kvconnect/internal/dl"
)

// Environment variables that [Open] reads.
const (
	// PathVar names the libcudart file to load, or a folder that holds
	// one. When it is set nothing else is tried.
	PathVar = "CUDART_PATH"
	// HomeVar names a CUDA toolkit whose lib64 and lib folders are tried
	// after the dynamic linker's search path.
	HomeVar = "CUDA_HOME"
)

// libraryNames are the sonames tried, newest first. Toolkits and
// distributions ship only versioned names at run time (Debian's
// libcudart11.0 has libcudart.so.11.0 and no libcudart.so).
func libraryNames() []string {
	return []string{"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}
}

// search returns where Open looks, given the value of CUDA_HOME.
func search(cudaHome string) dl.Search {
	var dirs []string
	if cudaHome != "" {
		dirs = append(dirs, filepath.Join(cudaHome, "lib64"), filepath.Join(cudaHome, "lib"))
	}
	dirs = append(dirs, "/usr/local/cuda/lib64", "/usr/local/cuda/lib")
	return dl.Search{Name: "libcudart", Var: PathVar, Names: libraryNames(), Dirs: dirs}
}
