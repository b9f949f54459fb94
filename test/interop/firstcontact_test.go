package interop

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeFileKeepsAnExistingImage: `serve --file` on an existing image
// serves it at its own size and leaves the file as it was; a --size that
// differs is refused (issue 26: a 64 MiB image was grown to 1 GiB, and a
// 2 GiB one was served as 1 GiB, silently).
func TestServeFileKeepsAnExistingImage(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small.img")
	big := filepath.Join(dir, "big.img")
	for p, n := range map[string]int64{small: 64 << 20, big: 2 << 30} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Truncate(p, n)
	}
	for p, blocks := range map[string]string{small: "blocks=131072", big: "blocks=4194304"} {
		d := serve(t, "--file", p)
		if !strings.Contains(d.log.String(), blocks) {
			t.Errorf("%s: served without %s:\n%s", filepath.Base(p), blocks, d.log)
		}
		d.stop(10 * time.Second)
	}
	if st, _ := os.Stat(small); st.Size() != 64<<20 {
		t.Fatalf("serving grew the 64 MiB image to %d bytes", st.Size())
	}
	out, code := blockwire(t, "serve", "--listen", freePort(t), "--file", small, "--size", "1GiB")
	if code == 0 || !strings.Contains(out, "grow") {
		t.Fatalf("--size larger than the image: exit %d\n%s", code, out)
	}
	out, code = blockwire(t, "serve", "--listen", freePort(t), "--file", big, "--size", "1GiB")
	if code == 0 || !strings.Contains(out, "shrink") {
		t.Fatalf("--size smaller than the image: exit %d\n%s", code, out)
	}
	if st, _ := os.Stat(small); st.Size() != 64<<20 {
		t.Fatalf("a refused serve changed the image to %d bytes", st.Size())
	}
	d := serve(t, "--file", small, "--size", "128MiB", "--grow")
	if !strings.Contains(d.log.String(), "blocks=262144") {
		t.Fatalf("--grow: %s", d.log)
	}
	d.stop(10 * time.Second)
	fresh := filepath.Join(dir, "fresh.img")
	d = serve(t, "--file", fresh)
	d.stop(10 * time.Second)
	if st, err := os.Stat(fresh); err != nil || st.Size() != 1<<30 {
		t.Fatalf("a missing file is created at the default size: %v", err)
	}
}
