package file

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestOneServerPerImage: a file served read-write is locked (an open file
// description lock): a second Open of it — read-write or read-only, in
// this process or another — is refused with the holder's pid, and Close
// releases it. Read-only opens share the image with each other.
func TestOneServerPerImage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.img")
	a, err := Open(path, Options{Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	pid := fmt.Sprintf("pid %d", os.Getpid())
	for _, ro := range []bool{false, true} {
		b, err := Open(path, Options{ReadOnly: ro})
		if err == nil {
			b.Close()
			t.Fatalf("a second Open (read-only %v) of a served image succeeded", ro)
		}
		if !strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), pid) {
			t.Errorf("second Open (read-only %v): %v: want it named in use by %s", ro, err, pid)
		}
	}
	// Another process sees the lock too (flock(1) takes a BSD lock,
	// which Linux keeps apart from OFD locks; a helper run of this test
	// binary takes ours).
	if os.Getenv("BLOCKWIRE_LOCK_CHILD") == "" {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "BLOCKWIRE_LOCK_CHILD="+path)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), "refused: ") || !strings.Contains(string(out), pid) {
			t.Errorf("another process opening the served image:\n%s", out)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open after the holder closed: %v", err)
	}
	b.Close()

	r1, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	r2, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("two read-only opens: %v", err)
	}
	r2.Close()
	if w, err := Open(path, Options{}); err == nil {
		w.Close()
		t.Fatal("a read-write Open of an image served read-only succeeded")
	}
}

// TestMain runs TestOneServerPerImage's other process when asked: it
// opens the image named in BLOCKWIRE_LOCK_CHILD and says what Open said.
func TestMain(m *testing.M) {
	if path := os.Getenv("BLOCKWIRE_LOCK_CHILD"); path != "" {
		b, err := Open(path, Options{})
		if err == nil {
			b.Close()
			fmt.Println("opened")
			os.Exit(1)
		}
		fmt.Printf("refused: %v\n", err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}
