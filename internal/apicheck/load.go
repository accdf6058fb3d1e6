package apicheck

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// A Package is one package that Load found.
type Package struct {
	ImportPath string
	Dir        string // the package's directory, as go list reports it
	Types      *types.Package
}

// Load runs go list -export in dir for the packages that patterns name,
// building them if needed, and reads their types from the export data the
// compiler wrote, as the type checker imports a dependency. It returns
// them sorted by import path. A package that does not build is an error
// that carries go list's output. Load blocks until go list is done; ctx
// cancels it.
func Load(ctx context.Context, dir string, patterns ...string) ([]Package, error) {
	if len(patterns) == 0 {
		return nil, errors.New("apicheck: load: no packages named")
	}
	args := append([]string{"list", "-export", "-deps", "-json=ImportPath,Dir,Export,DepOnly", "--"}, patterns...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("apicheck: go list %s: %w\n%s", strings.Join(patterns, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}

	exports := make(map[string]string) // import path -> export data file
	var roots []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath, Dir, Export string
			DepOnly                 bool
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("apicheck: go list %s: reading its output: %w", strings.Join(patterns, " "), err)
		}
		exports[p.ImportPath] = p.Export
		if !p.DepOnly {
			roots = append(roots, Package{ImportPath: p.ImportPath, Dir: p.Dir})
		}
	}

	lookup := func(path string) (io.ReadCloser, error) {
		file := exports[path]
		if file == "" {
			return nil, fmt.Errorf("no export data for %q from go list", path)
		}
		return os.Open(file)
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", lookup)
	for i := range roots {
		pkg, err := imp.Import(roots[i].ImportPath)
		if err != nil {
			return nil, fmt.Errorf("apicheck: load %s: %w", roots[i].ImportPath, err)
		}
		roots[i].Types = pkg
	}
	slices.SortFunc(roots, func(a, b Package) int { return cmp.Compare(a.ImportPath, b.ImportPath) })
	return roots, nil
}
