//go:build rbd

package rbd

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend"
)

// These tests run against a real Ceph cluster: BLOCKWIRE_CEPH_CONF names
// its ceph.conf (.ci/run starts a throwaway one with test/ceph/up.sh).
// Built with the rbd tag and no cluster is a failure, not a skip.
func cluster(t *testing.T) string {
	t.Helper()
	conf := os.Getenv("BLOCKWIRE_CEPH_CONF")
	if conf == "" {
		t.Fatal("BLOCKWIRE_CEPH_CONF is not set: start a cluster with test/ceph/up.sh DIR and point it at DIR/ceph.conf")
	}
	return conf
}

// rbdCLI runs Debian's rbd tool against the cluster.
func rbdCLI(t *testing.T, conf string, args ...string) string {
	t.Helper()
	out, err := exec.Command("rbd", append([]string{"-c", conf}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rbd %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newImage creates a fresh image in pool rbd (created if missing).
func newImage(t *testing.T, conf string, size string) string {
	t.Helper()
	out, _ := exec.Command("ceph", "-c", conf, "osd", "pool", "ls").CombinedOutput()
	if !strings.Contains(string(out), "rbd\n") {
		if o, err := exec.Command("ceph", "-c", conf, "osd", "pool", "create", "rbd", "8").CombinedOutput(); err != nil {
			t.Fatalf("pool: %v %s", err, o)
		}
		rbdCLI(t, conf, "pool", "init", "rbd")
	}
	name := fmt.Sprintf("t%d", rand.Uint64())
	rbdCLI(t, conf, "create", "--size", size, "rbd/"+name)
	t.Cleanup(func() { exec.Command("rbd", "-c", conf, "rm", "--no-progress", "rbd/"+name).Run() })
	return name
}

func open(t *testing.T, conf, name string) *Image {
	t.Helper()
	im, err := Open(Config{ConfFile: conf, Pool: "rbd", Image: name})
	if err != nil {
		t.Fatal(err)
	}
	return im
}

func TestReadWriteConcurrent(t *testing.T) {
	conf := cluster(t)
	name := newImage(t, conf, "64M")
	im := open(t, conf, name)
	defer im.Close()
	if im.Size() != 64<<20 {
		t.Fatalf("size %d", im.Size())
	}
	// 64 writers, each its own 64 KiB stripes, more than the slots in
	// flight; then every stripe read back concurrently.
	const bs = 64 << 10
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Go(func() {
			b := make([]byte, bs)
			for i := g; i < (64<<20)/bs; i += 64 {
				for j := range b {
					b[j] = byte(i*7 + j)
				}
				if _, err := im.WriteAt(b, int64(i)*bs); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	for g := range 64 {
		wg.Go(func() {
			b := make([]byte, bs)
			for i := g; i < (64<<20)/bs; i += 64 {
				if _, err := im.ReadAt(b, int64(i)*bs); err != nil {
					errs <- err
					return
				}
				for j := range b {
					if b[j] != byte(i*7+j) {
						errs <- fmt.Errorf("stripe %d byte %d: %#x", i, j, b[j])
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := im.Flush(); err != nil {
		t.Fatal(err)
	}
	// Another client (the rbd tool) sees the data: it is in the cluster,
	// not in this process.
	if err := im.Close(); err != nil {
		t.Fatal(err)
	}
	dump := t.TempDir() + "/img"
	rbdCLI(t, conf, "export", "--no-progress", "rbd/"+name, dump)
	got, err := os.ReadFile(dump)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(got); i += bs {
		if got[i+5] != byte((i/bs)*7+5) {
			t.Fatalf("exported stripe %d differs", i/bs)
		}
	}
}

func TestUnmapReadsZeroes(t *testing.T) {
	conf := cluster(t)
	im := open(t, conf, newImage(t, conf, "16M"))
	defer im.Close()
	full := bytes.Repeat([]byte{0xab}, 16<<20)
	if _, err := im.WriteAt(full, 0); err != nil {
		t.Fatal(err)
	}
	// A whole 4 MiB object and partial ones on both sides.
	off, n := int64(3<<20+512), int64(6<<20)
	if err := im.Unmap(off, n); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 16<<20)
	if _, err := im.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		in := int64(i) >= off && int64(i) < off+n
		if in && b != 0 || !in && b != 0xab {
			t.Fatalf("byte %d = %#x after unmapping [%d,+%d)", i, b, off, n)
		}
	}
}

func TestCompareAndWrite(t *testing.T) {
	conf := cluster(t)
	im := open(t, conf, newImage(t, conf, "8M"))
	defer im.Close()
	old := bytes.Repeat([]byte{1}, 512)
	if _, err := im.WriteAt(old, 8192); err != nil {
		t.Fatal(err)
	}
	nw := bytes.Repeat([]byte{2}, 512)
	if err := im.CompareAndWrite(old, nw, 8192); err != nil {
		t.Fatalf("matching compare: %v", err)
	}
	// Now the medium holds 2s: a comparison differing only at byte 300
	// fails there and writes nothing. (librbd compares one sector.)
	bad := bytes.Repeat([]byte{2}, 512)
	bad[300] = 9
	var mis *backend.MiscompareError
	err := im.CompareAndWrite(bad, old, 8192)
	if !errors.As(err, &mis) || mis.Offset != 300 {
		t.Fatalf("miscompare: %v (%+v)", err, mis)
	}
	got := make([]byte, 512)
	im.ReadAt(got, 8192)
	if !bytes.Equal(got, nw) {
		t.Fatal("a failed compare-and-write wrote")
	}
}

func TestResizeSeenAndIdentity(t *testing.T) {
	conf := cluster(t)
	name := newImage(t, conf, "8M")
	im := open(t, conf, name)
	defer im.Close()
	other := open(t, conf, name)
	defer other.Close()
	if im.Identity() != other.Identity() || !strings.HasPrefix(im.Identity(), "rbd:") {
		t.Fatalf("identities %q and %q", im.Identity(), other.Identity())
	}
	changed := make(chan struct{}, 4)
	im.WatchCapacity(func() { changed <- struct{}{} })
	// Resized by another client: the rbd tool.
	rbdCLI(t, conf, "resize", "--no-progress", "--size", "16M", "rbd/"+name)
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no capacity change reported after rbd resize")
	}
	if im.Size() != 16<<20 {
		t.Fatalf("size after resize %d", im.Size())
	}
}

func TestOpenErrors(t *testing.T) {
	conf := cluster(t)
	if _, err := Open(Config{ConfFile: conf, Pool: "rbd", Image: "no-such-image"}); err == nil || !strings.Contains(err.Error(), "no-such-image") {
		t.Fatalf("missing image: %v", err)
	}
	if _, err := Open(Config{ConfFile: conf, Pool: "no-such-pool", Image: "x"}); err == nil {
		t.Fatal("missing pool opened")
	}
	for _, s := range []string{"", "a", "/x", "a/", "a/b/c/d"} {
		if _, _, _, err := ParseSpec(s); err == nil {
			t.Errorf("ParseSpec(%q) accepted", s)
		}
	}
	if p, ns, i, err := ParseSpec("p/ns/i"); err != nil || p != "p" || ns != "ns" || i != "i" {
		t.Errorf("ParseSpec: %q %q %q %v", p, ns, i, err)
	}
}

// A read or a write allocates nothing in Go: the slot, its completion
// channel and the pinning are reused (the hot path of a LUN).
func TestNoAllocationsPerIO(t *testing.T) {
	conf := cluster(t)
	im := open(t, conf, newImage(t, conf, "8M"))
	defer im.Close()
	buf := make([]byte, 4096)
	im.WriteAt(buf, 0) // warm up: the pinner's first use
	im.ReadAt(buf, 0)
	w := testing.AllocsPerRun(200, func() { im.WriteAt(buf, 4096) })
	r := testing.AllocsPerRun(200, func() { im.ReadAt(buf, 4096) })
	if w > 0 || r > 0 {
		t.Fatalf("allocations per write %.1f, per read %.1f; want 0", w, r)
	}
}
