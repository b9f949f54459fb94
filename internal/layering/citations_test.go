package layering

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCitationsNameTheirDocuments: code comments and messages cite a
// specification by its name and section (RFC 5046 §7.3.5,
// draft-ietf-ips-iwarp-da §10.2), not by the number of a file under
// shared/seeds or of an issue in a tracker — neither of which a reader of
// the repository has.
func TestCitationsNameTheirDocuments(t *testing.T) {
	bad := regexp.MustCompile(`(?i)\b(issue #?\d+|seeds? 00\d)\b`)
	split := regexp.MustCompile(`(?i)\b(issue|seeds?)\s*$`)
	number := regexp.MustCompile(`^\s*//\s*#?\d`)
	for _, path := range goFiles(t, true) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		for n, line := range lines {
			if m := bad.FindString(line); m != "" {
				t.Errorf("%s:%d cites %q: name the document and its section instead", path, n+1, m)
			}
			// The same, broken across two comment lines.
			if n+1 < len(lines) && split.MatchString(line) && number.MatchString(lines[n+1]) {
				t.Errorf("%s:%d cites a seed file or an issue by number across the line break: name the document instead", path, n+1)
			}
		}
	}
}

// goFiles are the module's Go files (its tests too, with tests), outside
// hidden directories; the test fails when there are implausibly few.
func goFiles(t *testing.T, tests bool) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "../.." && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && (tests || !strings.HasSuffix(path, "_test.go")) {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 100 {
		t.Fatalf("only %d Go files found under the module root", len(out))
	}
	return out
}
