package apicheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// dep is a package the listed sources import, for qualified names.
const dep = `package dep

type T struct{}

func (T) Shared() int { return 0 }
`

// check type-checks src as package p, which may import "dep".
func check(t *testing.T, src string) *types.Package {
	t.Helper()
	fset := token.NewFileSet()
	parse := func(name, src string) *ast.File {
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		return f
	}
	depPkg, err := new(types.Config).Check("example.com/dep", fset, []*ast.File{parse("dep.go", dep)}, nil)
	if err != nil {
		t.Fatalf("check dep: %v", err)
	}
	conf := types.Config{Importer: importerFunc(func(path string) (*types.Package, error) {
		if path != "example.com/dep" {
			t.Fatalf("import %q: only example.com/dep is known", path)
		}
		return depPkg, nil
	})}
	pkg, err := conf.Check("example.com/p", fset, []*ast.File{parse("p.go", "package p\n\nimport \"example.com/dep\"\n\nvar _ dep.T\n\n"+src)}, nil)
	if err != nil {
		t.Fatalf("check p: %v", err)
	}
	return pkg
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

func TestListing(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{
			name: "unexported names are left out",
			src:  "const c = 1\nvar v int\nfunc f() {}\ntype t struct{}\nfunc (t) M() {}",
			want: nil,
		},
		{
			name: "constants with their type and exact value",
			src:  "type Phase uint8\nconst (Ready Phase = 1; Max = 1 << 40; Name = \"kv\"; Ratio = 0.5)",
			want: []string{
				"const Max untyped int = 1099511627776",
				"const Name untyped string = \"kv\"",
				"type Phase uint8",
				"const Ratio untyped float = 1/2",
				"const Ready Phase = 1",
			},
		},
		{
			name: "variables",
			src:  "var ErrClosed error\nvar Default = &dep.T{}",
			want: []string{"var Default *dep.T", "var ErrClosed error"},
		},
		{
			name: "signatures without parameter names",
			src: "func Open(name string, n int) (*dep.T, error) { return nil, nil }\n" +
				"func Log(format string, args ...any) {}\n" +
				"func Each(f func(key string) bool) {}\n" +
				"func Map[K comparable, V any](m map[K]V) []K { return nil }",
			want: []string{
				"func Each(func(key string) bool)",
				"func Log(string, ...any)",
				"func Map[K comparable, V any](map[K]V) []K",
				"func Open(string, int) (*dep.T, error)",
			},
		},
		{
			name: "aliases keep their name and show their target",
			src:  "type Copy = struct{ Dst, Src uintptr; N int }\ntype Token = uint32\ntype List[T any] = []T\ntype D = dep.T",
			want: []string{
				"type Copy = struct{Dst uintptr; Src uintptr; N int}",
				"type D = dep.T",
				"type List[T any] = []T",
				"type Token = uint32",
			},
		},
		{
			name: "struct fields in order, embedded ones, and the method set with promoted methods",
			src: "type Config struct {\n\tName string\n\thidden int\n\tdep.T\n\tSize *int\n}\n" +
				"func (c Config) Validate() error { return nil }\n" +
				"func (c *Config) EnsureDefaults() {}\n" +
				"func (c *Config) private() {}",
			want: []string{
				"type Config struct",
				"type Config struct, Name string",
				"type Config struct, embedded dep.T",
				"type Config struct, Size *int",
				"method (*Config) EnsureDefaults()",
				"method (Config) Shared() int",
				"method (Config) Validate() error",
			},
		},
		{
			name: "generic types name their parameters on the receiver",
			src:  "type Tally[T any] struct{ m map[uint64]T }\nfunc (t *Tally[T]) Get(id uint64) (T, bool) { var z T; return z, false }",
			want: []string{
				"type Tally[T any] struct",
				"method (*Tally[T]) Get(uint64) (T, bool)",
			},
		},
		{
			name: "interfaces list their methods, embedded ones included, and say when some are unexported",
			src: "type Closer interface{ Close() error }\n" +
				"type Store interface {\n\tCloser\n\tGet(key string, dst []byte) (int, error)\n}\n" +
				"type Sealed interface{ Name() string; sealed() }\n" +
				"type Hidden interface{ hidden() }\n" +
				"type Empty interface{}",
			want: []string{
				"type Closer interface { Close }",
				"type Closer interface, Close() error",
				"type Empty interface {}",
				"type Hidden interface { unexported methods }",
				"type Sealed interface { Name, unexported methods }",
				"type Sealed interface, Name() string",
				"type Store interface { Close, Get }",
				"type Store interface, Close() error",
				"type Store interface, Get(string, []byte) (int, error)",
			},
		},
		{
			name: "constraints show their type set",
			src:  "type Number interface{ ~int | ~float64 }",
			want: []string{"type Number interface{~int | ~float64}"},
		},
		{
			name: "other defined types show their underlying type and methods",
			src:  "type Policy string\nfunc (p Policy) String() string { return string(p) }\ntype Hook func(ev int) error",
			want: []string{
				"type Hook func(ev int) error",
				"type Policy string",
				"method (Policy) String() string",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Listing(check(t, tt.src))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Listing(%q) mismatch (-want +got):\n%s", tt.src, diff)
			}
		})
	}
}
