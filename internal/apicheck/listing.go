package apicheck

import (
	"fmt"
	"go/types"
	"strings"
)

// Listing returns the exported API of pkg, one declaration a line, in the
// format of the package documentation: the exported names of the package
// scope in sorted order, each followed by its fields, interface methods
// and method set. The same API always gives the same lines.
func Listing(pkg *types.Package) []string {
	q := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Name()
	}
	var lines []string
	scope := pkg.Scope()
	for _, name := range scope.Names() { // sorted
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Const:
			lines = append(lines, fmt.Sprintf("const %s %s = %s", name, types.TypeString(obj.Type(), q), obj.Val().ExactString()))
		case *types.Var:
			lines = append(lines, fmt.Sprintf("var %s %s", name, types.TypeString(obj.Type(), q)))
		case *types.Func:
			lines = append(lines, "func "+name+signature(obj.Signature(), q))
		case *types.TypeName:
			lines = append(lines, typeLines(obj, q)...)
		}
	}
	return lines
}

// typeLines lists a type declaration: an alias on one line, a defined
// type with its exported fields or interface methods, then its method set.
func typeLines(obj *types.TypeName, q types.Qualifier) []string {
	name := obj.Name()
	if alias, ok := obj.Type().(*types.Alias); ok {
		return []string{fmt.Sprintf("type %s%s = %s", name, typeParams(alias.TypeParams(), q), types.TypeString(alias.Rhs(), q))}
	}
	named, ok := obj.Type().(*types.Named)
	if !ok { // a type name of the universe cannot be declared in a package
		return []string{fmt.Sprintf("type %s %s", name, types.TypeString(obj.Type().Underlying(), q))}
	}
	head := "type " + name + typeParams(named.TypeParams(), q)
	var lines []string
	switch u := named.Underlying().(type) {
	case *types.Struct:
		lines = append(lines, head+" struct")
		for f := range u.Fields() {
			switch {
			case !f.Exported():
			case f.Embedded():
				lines = append(lines, fmt.Sprintf("%s struct, embedded %s", head, types.TypeString(f.Type(), q)))
			default:
				lines = append(lines, fmt.Sprintf("%s struct, %s %s", head, f.Name(), types.TypeString(f.Type(), q)))
			}
		}
	case *types.Interface:
		if !u.IsMethodSet() { // a constraint with a type set
			return []string{head + " " + types.TypeString(u, q)}
		}
		var names []string
		unexported := false
		var methods []string
		for m := range u.Methods() { // sorted, embedded interfaces' included
			if !m.Exported() {
				unexported = true
				continue
			}
			names = append(names, m.Name())
			methods = append(methods, fmt.Sprintf("%s interface, %s%s", head, m.Name(), signature(m.Signature(), q)))
		}
		if unexported {
			names = append(names, "unexported methods")
		}
		sum := head + " interface {}"
		if len(names) > 0 {
			sum = head + " interface { " + strings.Join(names, ", ") + " }"
		}
		return append([]string{sum}, methods...)
	default:
		lines = append(lines, head+" "+types.TypeString(u, q))
	}
	return append(lines, methodLines(named, q)...)
}

// methodLines lists the exported method set of *T, promoted methods
// included, each with the receiver it needs.
func methodLines(named *types.Named, q types.Qualifier) []string {
	recv := named.Obj().Name()
	if tps := named.TypeParams(); tps.Len() > 0 {
		names := make([]string, tps.Len())
		for i := range names {
			names[i] = tps.At(i).Obj().Name()
		}
		recv += "[" + strings.Join(names, ", ") + "]"
	}
	value := types.NewMethodSet(named)
	var lines []string
	for sel := range types.NewMethodSet(types.NewPointer(named)).Methods() { // sorted by name
		m := sel.Obj().(*types.Func)
		if !m.Exported() {
			continue
		}
		r := "*" + recv
		if value.Lookup(m.Pkg(), m.Name()) != nil {
			r = recv
		}
		lines = append(lines, fmt.Sprintf("method (%s) %s%s", r, m.Name(), signature(m.Signature(), q)))
	}
	return lines
}

// signature writes sig without its receiver and its parameter names:
// [T any](int, ...string) (X, error).
func signature(sig *types.Signature, q types.Qualifier) string {
	var b strings.Builder
	b.WriteString(typeParams(sig.TypeParams(), q))
	b.WriteByte('(')
	params := sig.Params()
	for i := range params.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		t := params.At(i).Type()
		if sig.Variadic() && i == params.Len()-1 {
			b.WriteString("...")
			if s, ok := t.(*types.Slice); ok {
				t = s.Elem()
			}
		}
		b.WriteString(types.TypeString(t, q))
	}
	b.WriteByte(')')
	results := sig.Results()
	switch results.Len() {
	case 0:
	case 1:
		b.WriteString(" " + types.TypeString(results.At(0).Type(), q))
	default:
		b.WriteString(" (")
		for i := range results.Len() {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(types.TypeString(results.At(i).Type(), q))
		}
		b.WriteByte(')')
	}
	return b.String()
}

// typeParams writes [K comparable, V any], or nothing.
func typeParams(tps *types.TypeParamList, q types.Qualifier) string {
	if tps.Len() == 0 {
		return ""
	}
	parts := make([]string, tps.Len())
	for i := range parts {
		tp := tps.At(i)
		parts[i] = tp.Obj().Name() + " " + types.TypeString(tp.Constraint(), q)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
