// Command apilist writes the readable listing of the exported API of some
// packages of the module, one file each, for scripts/api-check.sh:
//
//	apilist -o DIR PKGDIR...
//
// Run it in the module root. PKGDIR is a package's directory relative to
// it, such as connector or store/memstore; its listing goes to
// DIR/PKGDIR.txt. See package apicheck for the format.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvconnect/kvconnect/internal/apicheck"
)

func main() {
	out := flag.String("o", "", "folder to write the listings to")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: apilist -o DIR PKGDIR...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(context.Background(), *out, flag.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "apilist: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out string, dirs []string) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	patterns := make([]string, len(dirs))
	for i, d := range dirs {
		patterns[i] = "./" + filepath.ToSlash(filepath.Clean(d))
	}
	pkgs, err := apicheck.Load(ctx, root, patterns...)
	if err != nil {
		return err
	}
	for _, p := range pkgs {
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return fmt.Errorf("package %s: directory %s is not under %s", p.ImportPath, p.Dir, root)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "# Exported API of %s, one declaration a line (see internal/apicheck).\n", p.ImportPath)
		fmt.Fprintf(&b, "# Written by scripts/api-check.sh -update; do not edit.\n")
		for _, line := range apicheck.Listing(p.Types) {
			b.WriteString(line + "\n")
		}
		file := filepath.Join(out, rel+".txt")
		if err := os.MkdirAll(filepath.Dir(file), 0o777); err != nil {
			return err
		}
		if err := os.WriteFile(file, []byte(b.String()), 0o666); err != nil {
			return err
		}
	}
	return nil
}
