package interop

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSRPBenchVerifyAndCopy runs the blockwire binary's SRP initiator
// against "blockwire serve --srp-listen" over software iWARP: the
// verifying benchmark for reads and writes at QD 1 and 32 (4 KiB, which
// goes as immediate data, and 128 KiB, which the target fetches with RDMA
// Reads), then a 64 MiB copy in and out that must come back
// byte-identical, then the same bytes read over iSCSI/TCP: both fabrics
// serve one SCSI target.
func TestSRPBenchVerifyAndCopy(t *testing.T) {
	srpAddr := freePort(t)
	d := serve(t, "--size", "96MiB", "--srp-listen", srpAddr)
	var url string
	for deadline := time.Now().Add(5 * time.Second); url == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := regexp.MustCompile(`url=(srp://\S+)`).FindStringSubmatch(d.log.String()); m != nil {
			url = m[1]
		}
	}
	if url == "" {
		t.Fatalf("no SRP URL in the log:\n%s", d.log.String())
	}
	for _, bs := range []string{"4k", "128k"} {
		for _, rw := range []string{"randwrite", "randread"} {
			for _, qd := range []string{"1", "32"} {
				benchVerify(t, "srp", url, "--bs", bs, "--rw", rw, "--qd", qd, "--size", "32MiB")
			}
		}
	}
	data, dir := copyThrough(t, "SRP", url)
	viaTCP := filepath.Join(dir, "tcp.img")
	if out, code := blockwire(t, "copy", d.url(defaultIQN, 0), viaTCP); code != 0 {
		t.Fatalf("copy over iSCSI/TCP (exit %d):\n%s", code, out)
	}
	got, _ := os.ReadFile(viaTCP)
	if len(got) < len(data) || !bytes.Equal(got[:len(data)], data) {
		t.Fatal("iSCSI/TCP reads different bytes than SRP wrote")
	}
	// A wrong target port is refused with the SRP reason, exit code 4.
	bad := regexp.MustCompile(`/[0-9a-f]{16}:[0-9a-f]{16}/`).ReplaceAllString(url, "/0000000000000001/")
	out, code := blockwire(t, "inquiry", bad)
	if code != 4 || !strings.Contains(out, "unable to associate RDMA channel with I_T nexus") {
		t.Fatalf("login to a wrong target port: exit %d\n%s", code, out)
	}
	if strings.Contains(d.log.String(), "level=ERROR") {
		t.Errorf("target logged errors:\n%s", d.log.String())
	}
}
