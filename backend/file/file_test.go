package file

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sizeOf(t *testing.T, p string) int64 {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// TestExistingFileKeepsItsSize: an existing image is served at its own
// size; a different size is refused and the file left untouched, unless
// growing was asked for — and shrinking never is (a 64 MiB
// image was grown to 1 GiB, a 2 GiB one served as 1 GiB).
func TestExistingFileKeepsItsSize(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Truncate(p, 64<<20)

	f, err := Open(p, Options{})
	if err != nil || f.Size() != 64<<20 {
		t.Fatalf("no size: %v, %v", f, err)
	}
	f.Close()
	f, err = Open(p, Options{Size: 64 << 20})
	if err != nil || f.Size() != 64<<20 {
		t.Fatalf("its own size: %v", err)
	}
	f.Close()

	if _, err := Open(p, Options{Size: 1 << 30}); err == nil || !strings.Contains(err.Error(), "grow") {
		t.Fatalf("larger size without grow: %v", err)
	}
	if got := sizeOf(t, p); got != 64<<20 {
		t.Fatalf("refused open changed the file to %d bytes", got)
	}
	if _, err := Open(p, Options{Size: 32 << 20}); err == nil || !strings.Contains(err.Error(), "shrink") {
		t.Fatalf("smaller size: %v", err)
	}
	if _, err := Open(p, Options{Size: 32 << 20, Grow: true}); err == nil {
		t.Fatal("grow shrank the file")
	}
	f, err = Open(p, Options{Size: 128 << 20, Grow: true})
	if err != nil || f.Size() != 128<<20 || sizeOf(t, p) != 128<<20 {
		t.Fatalf("grow: %v", err)
	}
	f.Close()
}

func TestMissingFileIsCreatedSparse(t *testing.T) {
	p := filepath.Join(t.TempDir(), "new.img")
	if _, err := Open(p, Options{}); err == nil {
		t.Fatal("created a file without a size")
	}
	f, err := Open(p, Options{Size: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := os.Stat(p)
	if st.Size() != 16<<20 || st.Mode().Perm() != 0o600 {
		t.Fatalf("size %d mode %v", st.Size(), st.Mode())
	}
	if ok, end, _ := f.Mapped(0); ok || end != 16<<20 {
		t.Fatalf("new file not sparse: mapped %v to %d", ok, end)
	}
	if _, err := Open(p, Options{ReadOnly: true, Size: 32 << 20, Grow: true}); err == nil {
		t.Fatal("read-only grow")
	}
}

// TestResize: a regular file grows sparse (new space reads as zeroes)
// and shrinks; I/O follows the new size; read-only files do not change.
func TestResize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.img")
	b, err := Open(path, Options{Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.WriteAt([]byte("end"), 1<<20-3); err != nil {
		t.Fatal(err)
	}
	if err := b.Resize(2 << 20); err != nil || b.Size() != 2<<20 {
		t.Fatalf("grow: %v, size %d", err, b.Size())
	}
	if st, _ := os.Stat(path); st.Size() != 2<<20 {
		t.Fatalf("the file holds %d bytes after growing", st.Size())
	}
	got := make([]byte, 6)
	if _, err := b.ReadAt(got, 1<<20-3); err != nil || string(got) != "end\x00\x00\x00" {
		t.Fatalf("across the old end: %q %v", got, err)
	}
	if _, err := b.WriteAt([]byte("new"), 2<<20-3); err != nil {
		t.Fatalf("a write in the new space: %v", err)
	}
	if err := b.Resize(512 << 10); err != nil || b.Size() != 512<<10 {
		t.Fatalf("shrink: %v, size %d", err, b.Size())
	}
	if _, err := b.ReadAt(got, 1<<20-3); err == nil {
		t.Fatal("a read past the new end succeeded")
	}
	if st, _ := os.Stat(path); st.Size() != 512<<10 {
		t.Fatalf("the file holds %d bytes after shrinking", st.Size())
	}
	b.Close() // one server per image: the read-only one comes after
	ro, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.Resize(1 << 20); err == nil {
		t.Fatal("a read-only file was resized")
	}
}
