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
	d := serve(t, "--size", "96MiB")
	url := "iser://" + strings.TrimPrefix(d.url(defaultIQN, 0), "iscsi://")
	for _, profile := range []string{"linux", "rfc5046"} {
		for _, rw := range []string{"randwrite", "randread", "write", "read"} {
			for _, qd := range []string{"1", "32"} {
				out, code := blockwire(t, "bench", "--iser-profile", profile, "--rw", rw, "--qd", qd, "--time", "2s", "--size", "16MiB", "--verify", url)
				if code != 0 || !strings.Contains(out, "verify: 0 mismatches") || !strings.Contains(out, "IOPS=") {
					t.Fatalf("iSER (%s profile) bench %s qd %s (exit %d):\n%s", profile, rw, qd, code, out)
				}
				for _, line := range strings.Split(out, "\n") {
					if strings.Contains(line, "IOPS=") {
						t.Logf("iser %s %s qd=%s (verifying): %s", profile, rw, qd, strings.TrimSpace(line))
					}
				}
			}
		}
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	data := make([]byte, 64<<20)
	rand.Read(data)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := blockwire(t, "copy", src, url); code != 0 {
		t.Fatalf("copy to iSER (exit %d):\n%s", code, out)
	}
	back := filepath.Join(dir, "back.img")
	if out, code := blockwire(t, "copy", url, back); code != 0 {
		t.Fatalf("copy from iSER (exit %d):\n%s", code, out)
	}
	got, _ := os.ReadFile(back)
	if len(got) < len(data) || !bytes.Equal(got[:len(data)], data) {
		t.Fatalf("64 MiB through iSER came back different (%d bytes)", len(got))
	}
	viaTCP := filepath.Join(dir, "tcp.img")
	if out, code := blockwire(t, "copy", d.url(defaultIQN, 0), viaTCP); code != 0 {
		t.Fatalf("copy over iSCSI/TCP (exit %d):\n%s", code, out)
	}
	got, _ = os.ReadFile(viaTCP)
	if len(got) < len(data) || !bytes.Equal(got[:len(data)], data) {
		t.Fatal("iSCSI/TCP reads different bytes than iSER wrote")
	}
	if strings.Contains(d.log.String(), "level=ERROR") {
		t.Errorf("target logged errors:\n%s", d.log.String())
	}
}
