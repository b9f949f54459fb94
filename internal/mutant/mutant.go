// Package mutant puts a deliberate bug into a build, for the tests that
// must catch it: a copy of one source file with some code replaced, and a
// go build -overlay file that puts the copy in the original's place. The
// product holds no switch for the bug; when the code a mutation replaces
// changes, Overlay fails until the mutation is brought up to date.
package mutant

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Overlay writes into dir a copy of the Go source file src in which each
// key of edits, found exactly once, becomes its value, and an overlay file
// for go build -overlay that replaces src with the copy; it returns the
// overlay file's path.
func Overlay(dir, src string, edits map[string]string) (string, error) {
	abs, err := filepath.Abs(src)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(abs)
	if err != nil {
		return "", err
	}
	text := string(b)
	for old, new := range edits {
		if n := strings.Count(text, old); n != 1 {
			return "", fmt.Errorf("mutant: %s holds the mutated code %q %d times, want once: update the mutation", src, old, n)
		}
		text = strings.Replace(text, old, new, 1)
	}
	name := filepath.Base(src)
	copyPath := filepath.Join(dir, "mutant-"+name)
	if err := os.WriteFile(copyPath, []byte(text), 0o644); err != nil {
		return "", err
	}
	o, err := json.Marshal(map[string]map[string]string{"Replace": {abs: copyPath}})
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "overlay-"+name+".json")
	return path, os.WriteFile(path, o, 0o644)
}
