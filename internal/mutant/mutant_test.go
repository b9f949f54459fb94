package mutant

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOverlay(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "f.go")
	os.WriteFile(src, []byte("package f\n\nfunc F() int { return 1 }\n\nfunc G() int { return 2 }\n"), 0o644)
	path, err := Overlay(dir, src, map[string]string{"return 1": "return 3", "return 2": "return 4"})
	if err != nil {
		t.Fatal(err)
	}
	var o struct{ Replace map[string]string }
	b, _ := os.ReadFile(path)
	if err := json.Unmarshal(b, &o); err != nil || len(o.Replace) != 1 {
		t.Fatalf("overlay %s: %v", b, err)
	}
	got, _ := os.ReadFile(o.Replace[src])
	if want := "package f\n\nfunc F() int { return 3 }\n\nfunc G() int { return 4 }\n"; string(got) != want {
		t.Fatalf("mutant:\n%s\nwant:\n%s", got, want)
	}
	// Code that is gone, or found twice, is refused: the mutation is out
	// of date.
	for _, old := range []string{"return 9", "return"} {
		if _, err := Overlay(dir, src, map[string]string{old: "x"}); err == nil || !strings.Contains(err.Error(), "update the mutation") {
			t.Errorf("%q: %v", old, err)
		}
	}
}
