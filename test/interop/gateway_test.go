package interop

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGatewayInFrontOfTgt: tgt (Debian's, RAM LUN, loopback)
// behind blockwire: the gateway's LUN 0 is tgt's LUN 1 through our iSCSI
// initiator. Over iSER to the gateway, bench --verify passes in both iSER
// profiles; data copied in through the gateway reads back from tgt
// directly with qemu-img, byte-identical; the gateway refuses an initiator
// that wants end nodes only, and --prefer direct then reaches it as a
// gateway. When tgt goes away, commands fail with a retryable sense, not
// with wrong data.
func TestGatewayInFrontOfTgt(t *testing.T) {
	long(t)
	need(t, "qemu-img")
	const iqn = "iqn.2026-11.org.blockwire:behind-gateway"
	tgt, stopTgt := startTgtStop(t, iqn, 64<<20)
	remote := fmt.Sprintf("iscsi://%s/%s/1", tgt, iqn)
	gw := serve(t, "--remote", remote)
	iserURL := strings.Replace(gw.url(defaultIQN, 0), "iscsi://", "iser://", 1)

	out, code := blockwire(t, "inquiry", iserURL)
	if code != 0 || !strings.Contains(out, "capacity: 67108864 bytes") {
		t.Fatalf("inquiry through the gateway (exit %d):\n%s", code, out)
	}
	for _, qd := range []string{"1", "32"} {
		benchVerify(t, "gateway iser", iserURL, "--rw", "randwrite", "--qd", qd)
		benchVerify(t, "gateway iser rfc5046", iserURL, "--rw", "randwrite", "--qd", qd, "--iser-profile", "rfc5046")
	}

	// 32 MiB in through the gateway, out of tgt directly.
	src := randomImage(t, 32<<20)
	if out, code := blockwire(t, "copy", src, iserURL); code != 0 {
		t.Fatalf("copy through the gateway (exit %d):\n%s", code, out)
	}
	back := filepath.Join(t.TempDir(), "back.img")
	mustRun(t, 2*time.Minute, "qemu-img", "dd", "-f", "raw", "-O", "raw", "bs=1M", "count=32", "if="+remote, "of="+back)
	sameFirst(t, src, back, 32<<20)

	// The iSER-on-InfiniBand draft preferences: an end-node-only request is refused with a
	// reason; --prefer direct falls back to the gateway.
	out, code = blockwire(t, "inquiry", "--prefer", "direct", gw.url(defaultIQN, 0))
	if code != 0 || !strings.Contains(out, "capacity: 67108864 bytes") {
		t.Fatalf("inquiry --prefer direct (exit %d):\n%s", code, out)
	}
	if !strings.Contains(gw.log.String(), "an end node only was asked") {
		t.Fatalf("the gateway did not refuse the end-node-only connection:\n%s", gw.log)
	}

	// tgt gone: the gateway's reads fail with ABORTED COMMAND / LOGICAL
	// UNIT COMMUNICATION FAILURE (retryable), never with data.
	stopTgt()
	start := time.Now()
	dst := filepath.Join(t.TempDir(), "x")
	out, code = blockwire(t, "read", gw.url(defaultIQN, 0), "--length", "4096", "--out", dst)
	if code == 0 || !strings.Contains(out, "08/00") && !strings.Contains(strings.ToLower(out), "communication failure") {
		t.Fatalf("read with the remote target gone (exit %d, after %v):\n%s", code, time.Since(start), out)
	}
	if b, _ := os.ReadFile(dst); len(b) != 0 {
		t.Fatalf("%d bytes came back with the remote target gone", len(b))
	}
	t.Logf("with tgt gone, after %v: %s", time.Since(start).Round(time.Second), strings.TrimSpace(out))
}
