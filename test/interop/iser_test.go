package interop

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestISERBenchVerifyAndCopy runs the blockwire binary's initiator over
// iSER (software iWARP) against "blockwire serve", whose one port serves
// iSCSI/TCP and both iSER profiles: the verifying benchmark for reads and
// writes at QD 1 and 32 in the connection-first and the RFC 5046
// profile, then a 64 MiB copy in and out that must come back
// byte-identical, then the same bytes read over iSCSI/TCP.
func TestISERBenchVerifyAndCopy(t *testing.T) {
	long(t)
	d := serve(t, "--size", "96MiB")
	url := "iser://" + strings.TrimPrefix(d.url(defaultIQN, 0), "iscsi://")
	for _, profile := range []string{"linux", "rfc5046"} {
		for _, rw := range []string{"randwrite", "randread", "write", "read"} {
			for _, qd := range []string{"1", "32"} {
				benchVerify(t, "iser "+profile, url, "--iser-profile", profile, "--rw", rw, "--qd", qd, "--size", "16MiB")
			}
		}
	}
	data, dir := copyThrough(t, "iSER", url)
	viaTCP := filepath.Join(dir, "tcp.img")
	if out, code := blockwire(t, "copy", d.url(defaultIQN, 0), viaTCP); code != 0 {
		t.Fatalf("copy over iSCSI/TCP (exit %d):\n%s", code, out)
	}
	got, _ := os.ReadFile(viaTCP)
	if len(got) < len(data) || !bytes.Equal(got[:len(data)], data) {
		t.Fatal("iSCSI/TCP reads different bytes than iSER wrote")
	}
	if strings.Contains(d.log.String(), "level=ERROR") {
		t.Errorf("target logged errors:\n%s", d.log.String())
	}
}

// benchVerify runs "blockwire bench --verify" for 2 s and requires a clean
// pass; the figures are logged.
func benchVerify(t *testing.T, label, url string, args ...string) {
	t.Helper()
	out, code := blockwire(t, append(append([]string{"bench", "--time", "2s", "--verify", "--overwrite"}, args...), url)...)
	if code != 0 || !strings.Contains(out, "verify: 0 mismatches") || !strings.Contains(out, "IOPS=") {
		t.Fatalf("%s bench %v (exit %d):\n%s", label, args, code, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "IOPS=") {
			t.Logf("%s %v (verifying): %s", label, args, strings.TrimSpace(line))
		}
	}
}

// copyThrough copies 64 MiB of random data to url and back with
// "blockwire copy" and requires the same bytes; it returns the data and
// the temporary directory.
func copyThrough(t *testing.T, label, url string) ([]byte, string) {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	data := make([]byte, 64<<20)
	rand.Read(data)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := blockwire(t, "copy", src, url); code != 0 {
		t.Fatalf("copy to %s (exit %d):\n%s", label, code, out)
	}
	back := filepath.Join(dir, "back.img")
	if out, code := blockwire(t, "copy", url, back); code != 0 {
		t.Fatalf("copy from %s (exit %d):\n%s", label, code, out)
	}
	got, _ := os.ReadFile(back)
	if len(got) < len(data) || !bytes.Equal(got[:len(data)], data) {
		t.Fatalf("64 MiB through %s came back different (%d bytes)", label, len(got))
	}
	return data, dir
}
