package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// codecDirs are the wire codecs: they share iscsi/pdu's names for
// writing and reading a message (docs/architecture.md, Layers).
var codecDirs = []string{"iscsi/pdu", "scsi", "srp", "rdma/ib", "rdma/iwarp/mpa", "rdma/iwarp/ddp", "rdma/iwarp/rdmap", "isns", "nvme", "nvme/nvmetcp", "nvme/dhchap"}

// TestCodecsShareOneConvention: no codec names its encoder or decoder
// otherwise than Encode (a fixed-size message, in place), Append (a
// variable-size one, onto a slice) and Decode: a reader who knows one
// codec knows them all.
func TestCodecsShareOneConvention(t *testing.T) {
	other := map[string]bool{"Put": true, "Marshal": true, "MarshalBinary": true, "Unmarshal": true, "UnmarshalBinary": true,
		"Serialize": true, "Deserialize": true, "Pack": true, "Unpack": true, "Parse": true, "Bytes": true, "Write": true}
	fset := token.NewFileSet()
	checked := 0
	for _, path := range goFiles(t, false) {
		dir := filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, "../../")))
		codec := false
		for _, d := range codecDirs {
			codec = codec || dir == d
		}
		if !codec {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil {
				continue
			}
			checked++
			if other[fd.Name.Name] {
				t.Errorf("%s: method %s: a codec writes with Encode or Append and reads with Decode", fset.Position(fd.Pos()), fd.Name.Name)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d codec methods found: are codecDirs right?", checked)
	}
}
