// Package apicheck writes the readable half of the module's API record:
// a sorted listing of a package's exported API, one declaration a line,
// in the spirit of the Go distribution's api/go1.*.txt. It is for
// scripts/api-check.sh and its tests, not for callers of the module.
//
// The check itself is not here: scripts/api-check.sh compares the working
// tree with the export data in api/ using golang.org/x/exp/cmd/apidiff (a
// tool dependency in go.mod; no package of the module imports it), and
// fails on the incompatible changes apidiff reports. The listings beside
// that export data (api/*.txt) let a reviewer read an API change in a
// diff; the script says when one is stale but never fails on it. This
// package uses only the standard library.
//
// # Usage
//
//	pkgs, err := apicheck.Load(ctx, ".", "./connector")
//	for _, line := range apicheck.Listing(pkgs[0].Types) {
//		fmt.Println(line)
//	}
//
// The command apilist (internal/apicheck/apilist) writes one file per
// package this way.
//
// # Format
//
// Each exported name of the package scope, in sorted order, has one line,
// followed by the lines that belong to it:
//
//	const Ready Phase = 1
//	var ErrClosed error
//	func Register(string, OpenFunc)
//	type DeviceCopy = struct{Dst uintptr; Src uintptr; N int}
//	type Config struct
//	type Config struct, Role string
//	type Config struct, embedded rdma.Region
//	method (*Config) Validate() error
//	type Store interface { Get, Put, unexported methods }
//	type Store interface, Get(context.Context, []Key) error
//
// Parameter names are left out of signatures (they are not API), except
// inside function types that are themselves fields or parameters, where
// go/types prints them. Types of other packages are qualified by package
// name. A defined type's lines list its whole method set, promoted
// methods included, each with the receiver it needs (T or *T); unexported
// fields and methods are left out, except that an interface says it has
// some, since then no other package can implement it.
//
// # Concurrency
//
// Listing and Load are safe for concurrent use; Load runs go list.
package apicheck
