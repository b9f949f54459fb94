package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/node"
	"github.com/blockwire/blockwire/node/nodetest"
)

// TestClientVerbsDoNotClobber: a client verb destroys data only when told
// to. bench with a write workload and write onto a LUN need --overwrite;
// copy and read --out onto an existing non-empty file need --force; write
// checks that its input fits before it writes a byte. Each refusal leaves
// the LUN and the file as they were.
func TestClientVerbsDoNotClobber(t *testing.T) {
	const iqn = "iqn.2026-11.org.example:clobber"
	iser := false
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, ISER: &iser,
		Targets: []config.Target{{Name: iqn, LUNs: []config.LUN{{ID: 0, Size: "4MiB"}}}}}
	n := nodetest.Start(t, cfg, node.Options{})
	url := "iscsi://" + nodetest.Portal(t, n, "iscsi") + "/" + iqn + "/0"
	dir := t.TempDir()
	cli := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	marker := bytes.Repeat([]byte("keep me!"), 4<<20/8)
	in := filepath.Join(dir, "marker.img")
	os.WriteFile(in, marker, 0o600)
	if code, out := cli("write", "--in", in, url); code != exitUsage || !strings.Contains(out, "--overwrite") {
		t.Errorf("write without --overwrite: exit %d, want %d naming --overwrite:\n%s", code, exitUsage, out)
	}
	if code, out := cli("write", "--overwrite", "--in", in, url); code != 0 {
		t.Fatalf("write --overwrite: exit %d\n%s", code, out)
	}
	lunHolds := func(what string) {
		t.Helper()
		back := filepath.Join(dir, "back")
		os.Remove(back)
		if code, out := cli("read", url, "--out", back); code != 0 {
			t.Fatalf("%s: read: exit %d\n%s", what, code, out)
		}
		if b, _ := os.ReadFile(back); !bytes.Equal(b, marker) {
			t.Fatalf("%s: the LUN no longer holds what was written", what)
		}
	}

	for _, rw := range []string{"write", "randwrite"} {
		if code, out := cli("bench", "--rw", rw, "--time", "300ms", "--size", "1MiB", url); code != exitUsage || !strings.Contains(out, "--overwrite") {
			t.Errorf("bench --rw %s without --overwrite: exit %d, want %d naming --overwrite:\n%s", rw, code, exitUsage, out)
		}
	}
	lunHolds("after bench without --overwrite")

	big := filepath.Join(dir, "big.img")
	os.WriteFile(big, bytes.Repeat([]byte{0xee}, 8<<20), 0o600)
	if code, out := cli("write", "--overwrite", "--in", big, url); code != exitUsage || !strings.Contains(out, "does not fit") {
		t.Errorf("write of 8 MiB onto a 4 MiB LUN: exit %d, want %d saying it does not fit:\n%s", code, exitUsage, out)
	}
	small := filepath.Join(dir, "small.img")
	os.WriteFile(small, make([]byte, 8192), 0o600)
	if code, out := cli("write", "--overwrite", "--offset", "4190208", "--in", small, url); code != exitUsage || !strings.Contains(out, "does not fit") {
		t.Errorf("write of 8 KiB at 4 KiB before the end: exit %d, want %d saying it does not fit:\n%s", code, exitUsage, out)
	}
	lunHolds("after writes that do not fit")

	existing := filepath.Join(dir, "existing.img")
	keep := bytes.Repeat([]byte("precious"), 8<<20/8)
	os.WriteFile(existing, keep, 0o600)
	fileHolds := func(what string) {
		t.Helper()
		if b, _ := os.ReadFile(existing); !bytes.Equal(b, keep) {
			t.Errorf("%s: the existing file was changed (%d bytes now)", what, len(b))
		}
	}
	if code, out := cli("copy", url, existing); code != exitUsage || !strings.Contains(out, "--force") {
		t.Errorf("copy onto an existing file: exit %d, want %d naming --force:\n%s", code, exitUsage, out)
	}
	fileHolds("copy without --force")
	if code, out := cli("read", url, "--length", "1MiB", "--out", existing); code != exitUsage || !strings.Contains(out, "--force") {
		t.Errorf("read --out onto an existing file: exit %d, want %d naming --force:\n%s", code, exitUsage, out)
	}
	fileHolds("read --out without --force")
	if code, out := cli("copy", "--force", url, existing); code != 0 {
		t.Errorf("copy --force: exit %d\n%s", code, out)
	} else if b, _ := os.ReadFile(existing); !bytes.Equal(b, marker) {
		t.Errorf("copy --force: the file does not hold the LUN (%d bytes)", len(b))
	}
	// Devices and empty files hold nothing to lose.
	if code, out := cli("read", url, "--length", "4096", "--out", os.DevNull); code != 0 {
		t.Errorf("read --out %s: exit %d\n%s", os.DevNull, code, out)
	}
	empty := filepath.Join(dir, "empty.img")
	os.WriteFile(empty, nil, 0o600)
	if code, out := cli("copy", url, empty); code != 0 {
		t.Errorf("copy onto an empty file: exit %d\n%s", code, out)
	}
}
