package interop

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/servetest"
)

// startTgt runs Debian's tgtd with a RAM-backed (tmpfs) LUN 1 on a
// loopback port and returns the portal.
func startTgt(t *testing.T, iqn string, size int64) string {
	t.Helper()
	addr, _ := startTgtStop(t, iqn, size)
	return addr
}

// startTgtStop is startTgt that also returns a function stopping tgtd.
func startTgtStop(t *testing.T, iqn string, size int64) (string, func()) {
	t.Helper()
	need(t, "tgtd", "tgtadm")
	if os.Geteuid() != 0 {
		t.Skip("tgtd needs root")
	}
	addr := freePort(t)
	ctl := strconv.Itoa(100 + os.Getpid()%1000)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "tgtd", "-f", "-C", ctl, "--iscsi", "portal="+addr)
	log := &servetest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	backing := filepath.Join("/dev/shm", fmt.Sprintf("blockwire-tgt-%d.img", os.Getpid()))
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Truncate(backing, size)
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		os.Remove(backing)
		if t.Failed() {
			t.Logf("tgtd log:\n%s", log)
		}
	})
	adm := func(args ...string) {
		t.Helper()
		var out []byte
		var err error
		for try := 0; try < 50; try++ { // tgtd needs a moment to open its control socket
			out, err = exec.Command("tgtadm", append([]string{"-C", ctl, "--lld", "iscsi"}, args...)...).CombinedOutput()
			if err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("tgtadm %v: %v\n%s", args, err, out)
	}
	adm("--op", "new", "--mode", "target", "--tid", "1", "-T", iqn)
	adm("--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1", "-b", backing)
	adm("--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL")
	return addr, func() { cancel(); cmd.Wait() }
}

// clientEnv is the environment of a one-shot client run of the binary: the
// race detector's one-second sleep at exit (atexit_sleep_ms, there for
// reports from goroutines still running) is dropped — a client verb has
// ended its work when it exits, and the sleep made each of the hundreds
// of client runs in this package a second slower.
func clientEnv() []string {
	return append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
}

func blockwire(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = clientEnv()
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("blockwire %v: %v", args, err)
	}
	return string(out), code
}

// TestInitiatorAgainstTgt: our initiator writes to tgt and QEMU's libiscsi
// driver reads it back, and the reverse.
func TestInitiatorAgainstTgt(t *testing.T) {
	long(t)
	need(t, "qemu-img")
	const iqn = "iqn.2026-11.org.blockwire:tgt-peer"
	addr := startTgt(t, iqn, 64<<20)
	out, code := blockwire(t, "discover", addr)
	if code != 0 || !strings.Contains(out, addr+",1 "+iqn) {
		t.Fatalf("discover (exit %d):\n%s", code, out)
	}
	url := fmt.Sprintf("iscsi://%s/%s/1", addr, iqn)
	out, code = blockwire(t, "inquiry", url)
	if code != 0 || !strings.Contains(out, "capacity: 67108864 bytes") {
		t.Fatalf("inquiry (exit %d):\n%s", code, out)
	}
	src := randomImage(t, 32<<20)
	if out, code = blockwire(t, "write", "--overwrite", url, "--in", src); code != 0 {
		t.Fatalf("write (exit %d):\n%s", code, out)
	}
	back := filepath.Join(t.TempDir(), "back.img")
	mustRun(t, 2*time.Minute, "qemu-img", "dd", "-f", "raw", "-O", "raw", "bs=1M", "count=32", "if="+url, "of="+back)
	sameFirst(t, src, back, 32<<20)

	// Reverse: QEMU writes, we read.
	src2 := randomImage(t, 32<<20)
	mustRun(t, 2*time.Minute, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src2, url)
	back2 := filepath.Join(t.TempDir(), "back2.img")
	if out, code = blockwire(t, "read", url, "--length", "32MiB", "--out", back2); code != 0 {
		t.Fatalf("read (exit %d):\n%s", code, out)
	}
	sameFirst(t, src2, back2, 32<<20)

	// copy: file to LUN, LUN to LUN (tgt to blockwire), LUN to file.
	ours := serve(t, "--size", "64MiB")
	src3 := randomImage(t, 8<<20)
	if out, code = blockwire(t, "copy", src3, url); code != 0 {
		t.Fatalf("copy file to tgt (exit %d):\n%s", code, out)
	}
	ourURL := ours.url(defaultIQN, 0)
	if out, code = blockwire(t, "copy", url, ourURL); code != 0 {
		t.Fatalf("copy tgt to blockwire (exit %d):\n%s", code, out)
	}
	back3 := filepath.Join(t.TempDir(), "back3.img")
	mustRun(t, time.Minute, "qemu-img", "dd", "-f", "raw", "-O", "raw", "bs=1M", "count=8", "if="+ourURL, "of="+back3)
	sameFirst(t, src3, back3, 8<<20)

	// Errors scripts can tell apart.
	if _, code = blockwire(t, "inquiry", fmt.Sprintf("iscsi://%s/%s/9", addr, iqn)); code != 5 {
		t.Errorf("missing LUN: exit %d, want 5", code)
	}
	if _, code = blockwire(t, "inquiry", fmt.Sprintf("iscsi://%s/iqn.2026-11.org.blockwire:absent/1", addr)); code != 4 {
		t.Errorf("unknown target: exit %d, want 4", code)
	}
	if _, code = blockwire(t, "inquiry", "iscsi://"+freePort(t)+"/"+iqn+"/1"); code != 3 {
		t.Errorf("unreachable portal: exit %d, want 3", code)
	}
	if _, code = blockwire(t, "inquiry", "nonsense"); code != 2 {
		t.Errorf("bad URL: exit %d, want 2", code)
	}
}

// TestInitiatorBenchVerifyAgainstOurTarget runs the verifying benchmark at
// QD 1 and 32, reads and writes, and mutual CHAP with a wrong target
// secret.
func TestInitiatorBenchVerifyAgainstOurTarget(t *testing.T) {
	long(t)
	d := serve(t, "--size", "64MiB")
	url := d.url(defaultIQN, 0)
	for _, rw := range []string{"randwrite", "randread", "write", "read"} {
		for _, qd := range []string{"1", "32"} {
			out, code := blockwire(t, "bench", "--rw", rw, "--qd", qd, "--time", "2s", "--size", "16MiB", "--verify", "--overwrite", url)
			if code != 0 || !strings.Contains(out, "verify: 0 mismatches") || !strings.Contains(out, "IOPS=") {
				t.Fatalf("bench %s qd %s (exit %d):\n%s", rw, qd, code, out)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "IOPS=") {
					t.Logf("%s qd=%s (verifying): %s", rw, qd, strings.TrimSpace(line))
				}
			}
		}
	}
	cfg := filepath.Join(t.TempDir(), "chap.toml")
	os.WriteFile(cfg, []byte(`
[[target]]
name = "iqn.2026-11.org.blockwire:mutual"
[target.chap]
user = "alice"
secret = "alice-secret-123"
[target.mutual_chap]
user = "tgt"
secret = "target-secret-456"
[[target.lun]]
id = 0
size = "16MiB"
`), 0o600)
	m := serve(t, "--config", cfg)
	u := fmt.Sprintf("iscsi://alice%%alice-secret-123@%s/iqn.2026-11.org.blockwire:mutual/0", m.addr)
	if out, code := blockwire(t, "inquiry", "--target-secret", "tgt%target-secret-456", u); code != 0 {
		t.Fatalf("mutual CHAP (exit %d):\n%s", code, out)
	}
	out, code := blockwire(t, "inquiry", "--target-secret", "tgt%wrong-secret-000", u)
	if code != 4 || !strings.Contains(out, "mutual CHAP") {
		t.Fatalf("wrong target secret (exit %d):\n%s", code, out)
	}
}
