package rbd

import (
	"strings"
	"testing"
)

// FuzzParseSpec: an accepted spec has a pool and an image, none of its
// parts holds a '/', and they join back into the spec.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{"p/i", "p/ns/i", "p//i", "/i", "p/", "p", "a/b/c/d", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pool, ns, image, err := ParseSpec(s)
		if err != nil {
			return
		}
		if pool == "" || image == "" || strings.Contains(pool+ns+image, "/") {
			t.Fatalf("ParseSpec(%q) = %q %q %q", s, pool, ns, image)
		}
		back := pool + "/" + image
		if strings.Count(s, "/") == 2 {
			back = pool + "/" + ns + "/" + image
		}
		if back != s {
			t.Fatalf("ParseSpec(%q) = %q %q %q, which join to %q", s, pool, ns, image, back)
		}
	})
}
