package hashing

import (
	"os"
	"os/exec"
	"testing"
)

// requireCheckerVar makes TestIndependentChecker fail, rather than skip,
// when python3 or b3sum is missing.
const requireCheckerVar = "HASHING_CHECKER_REQUIRE"

// TestIndependentChecker runs testdata/check_vectors.py, a Python
// implementation of SPEC.md that uses the b3sum tool for BLAKE3, over
// testdata/vectors.json: the vectors must agree with a second reading of the
// spec, in another language, with another BLAKE3.
func TestIndependentChecker(t *testing.T) {
	var paths []string
	for _, tool := range []string{"python3", "b3sum"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			if os.Getenv(requireCheckerVar) == "1" {
				t.Fatalf("%s not found (%v), and %s=1", tool, err, requireCheckerVar)
			}
			t.Skipf("%s not found (%v): install python3 and b3sum (Debian package b3sum) to check the vectors independently; %s=1 makes this a failure", tool, err, requireCheckerVar)
		}
		paths = append(paths, p)
	}
	out, err := exec.Command(paths[0], "testdata/check_vectors.py", "--b3sum", paths[1]).CombinedOutput()
	if err != nil {
		t.Fatalf("testdata/check_vectors.py: %v\n%s", err, out)
	}
	t.Logf("testdata/check_vectors.py:\n%s", out)
}
