package dl

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCandidates(t *testing.T) {
	s := Search{
		Name:  "libx",
		Var:   "X_PATH",
		Names: []string{"libx.so.2", "libx.so.1"},
		Dirs:  []string{"/opt/x/lib64", "", "/usr/local/x/lib"},
	}
	tests := []struct {
		name  string
		val   string
		isDir bool
		want  []string
	}{
		{"unset", "", false, []string{
			"libx.so.2", "libx.so.1",
			"/opt/x/lib64/libx.so.2", "/opt/x/lib64/libx.so.1",
			"/usr/local/x/lib/libx.so.2", "/usr/local/x/lib/libx.so.1",
		}},
		{"file", "/home/u/libx.so", false, []string{"/home/u/libx.so"}},
		{"folder", "/home/u/lib", true, []string{"/home/u/lib/libx.so.2", "/home/u/lib/libx.so.1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := s.candidates(tt.val, tt.isDir)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("candidates(%q, %v) (-want +got):\n%s", tt.val, tt.isDir, diff)
			}
		})
	}
}

func TestNewAttempt(t *testing.T) {
	tests := []struct {
		name, path, msg   string
		absent            bool
		missingDependency string
	}{
		{"name absent", "libx.so.2", "libx.so.2: cannot open shared object file: No such file or directory", true, ""},
		{"path absent", "/opt/x/libx.so.2", "/opt/x/libx.so.2: cannot open shared object file: No such file or directory", true, ""},
		{"dependency of a name", "libx.so.2", "libfoo.so.1: cannot open shared object file: No such file or directory", false, "libfoo.so.1"},
		{"dependency of a path", "/opt/x/libx.so.2", "libfoo.so.1: cannot open shared object file: No such file or directory", false, "libfoo.so.1"},
		{"dependency after requester", "/opt/x/libx.so.2", "/opt/x/libx.so.2: libfoo.so.1: cannot open shared object file: No such file or directory", false, "libfoo.so.1"},
		{"bad ELF", "/etc/passwd", "/etc/passwd: invalid ELF header", false, ""},
		{"folder", "/tmp", "/tmp: cannot read file data: Is a directory", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAttempt(tt.path, tt.msg)
			if got := a.Absent(); got != tt.absent {
				t.Errorf("newAttempt(%q, %q).Absent() = %v, want %v", tt.path, tt.msg, got, tt.absent)
			}
			if got := a.MissingDependency(); got != tt.missingDependency {
				t.Errorf("newAttempt(%q, %q).MissingDependency() = %q, want %q", tt.path, tt.msg, got, tt.missingDependency)
			}
		})
	}
}

func TestOpenErrorMessage(t *testing.T) {
	e := &OpenError{Name: "libx", Var: "X_PATH", Attempts: []Attempt{
		newAttempt("libx.so.2", "libx.so.2: cannot open shared object file: No such file or directory"),
		newAttempt("libx.so.1", "libfoo.so.1: cannot open shared object file: No such file or directory"),
		newAttempt("/opt/x/libx.so.2", "/opt/x/libx.so.2: cannot open shared object file: No such file or directory"),
	}}
	if !errors.Is(e, ErrNotFound) {
		t.Errorf("errors.Is(%v, ErrNotFound) = false", e)
	}
	if got := e.MissingDependency(); got != "libfoo.so.1" {
		t.Errorf("MissingDependency() = %q, want libfoo.so.1", got)
	}
	msg := e.Error()
	for _, want := range []string{
		"load libx: missing dependency libfoo.so.1",
		"not found: libx.so.2, /opt/x/libx.so.2",
		"set X_PATH",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Error() = %q, want it to contain %q", msg, want)
		}
	}
	if strings.Index(msg, "libfoo") > strings.Index(msg, "; not found:") {
		t.Errorf("Error() = %q: the missing dependency must come before the absent candidates", msg)
	}

	set := &OpenError{Name: "libx", Var: "X_PATH", Value: "/home/u/libx.so", Attempts: []Attempt{
		newAttempt("/home/u/libx.so", "/home/u/libx.so: invalid ELF header"),
	}}
	if msg := set.Error(); !strings.Contains(msg, "from X_PATH=/home/u/libx.so") || !strings.Contains(msg, "invalid ELF header") {
		t.Errorf("Error() = %q, want the variable, its value and dlerror's message", msg)
	}
	none := &OpenError{Name: "libx"}
	if msg := none.Error(); !strings.Contains(msg, "no candidates") {
		t.Errorf("Error() = %q, want it to say there was nothing to try", msg)
	}
}

func TestParseMaps(t *testing.T) {
	maps := `55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 123 /usr/bin/prog
7f0000000000-7f0000010000 r--p 00000000 08:01 456 /usr/lib/x86_64-linux-gnu/libcudart.so.11.8.89
7f0000010000-7f0000080000 r-xp 00010000 08:01 456 /usr/lib/x86_64-linux-gnu/libcudart.so.11.8.89
7f0000080000-7f0000090000 rw-p 00000000 00:00 0
7f00000a0000-7f00000b0000 r-xp 00000000 08:01 789 /opt/my libs/libz.so
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]
`
	tests := []struct {
		addr uintptr
		want string
	}{
		{0x7f0000012345, "/usr/lib/x86_64-linux-gnu/libcudart.so.11.8.89"},
		{0x7f0000000000, "/usr/lib/x86_64-linux-gnu/libcudart.so.11.8.89"},
		{0x7f0000080000, ""},
		{0x7f00000a0010, "/opt/my libs/libz.so"},
		{0x7ffc00000010, ""},
		{0x1000, ""},
	}
	for _, tt := range tests {
		if got := parseMaps(maps, tt.addr); got != tt.want {
			t.Errorf("parseMaps(maps, %#x) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}
