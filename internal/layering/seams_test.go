package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
)

// TestNoAnonymousCapabilityProbes: a package asks another for an
// optional capability by that capability's name — datamover.Placer,
// rdma.CMPortSpace, backend's optional interfaces — not with an interface
// type written on the spot (x.(interface{ ISER() bool })), which hides the
// seam from a reader and from the compiler's help. The exceptions are the
// standard library's own conventions: CloseWrite on a net.Conn, AddrPort
// on a net.Addr.
func TestNoAnonymousCapabilityProbes(t *testing.T) {
	allowed := map[string]bool{"CloseWrite": true, "AddrPort": true}
	fset := token.NewFileSet()
	for _, path := range goFiles(t, false) {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		check := func(typ ast.Expr) {
			it, ok := typ.(*ast.InterfaceType)
			if !ok || it.Methods == nil || len(it.Methods.List) == 0 {
				return
			}
			for _, m := range it.Methods.List {
				for _, n := range m.Names {
					if allowed[n.Name] {
						return
					}
				}
			}
			t.Errorf("%s: a capability probed with an interface written on the spot: name it where the capability is defined", fset.Position(typ.Pos()))
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.TypeAssertExpr:
				if x.Type != nil {
					check(x.Type)
				}
			case *ast.TypeSwitchStmt:
				for _, c := range x.Body.List {
					for _, e := range c.(*ast.CaseClause).List {
						check(e)
					}
				}
			}
			return true
		})
	}
}
