package pcaptest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCopiesMatchShared: the repository's copies of the golden captures
// are byte for byte the project's (../shared/captures), when that is here.
func TestCopiesMatchShared(t *testing.T) {
	dir := Dir(t)
	shared := filepath.Join(dir, "..", "..", "..", "shared", "captures")
	names, err := filepath.Glob(filepath.Join(shared, "*.pcap"))
	if err != nil || len(names) == 0 {
		t.Skipf("no shared captures at %s to compare with", shared)
	}
	for _, n := range names {
		want, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, filepath.Base(n)))
		if err != nil {
			t.Errorf("%s: not copied to testdata/captures: %v", filepath.Base(n), err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: the copy in testdata/captures differs from shared/captures", filepath.Base(n))
		}
	}
}
