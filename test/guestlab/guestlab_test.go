//go:build guestlab

// Package guestlab runs the Linux kernel's iSCSI, iSER and RDMA code as
// test peers: a Debian kernel booted in QEMU (software emulation, no
// network device: nothing leaves the guest) with open-iscsi, LIO, siw and
// ib_iser, our statically linked blockwire injected beside them, and one
// scenario script per check that prints "LAB-RESULT: <scenario> rc=<n>" on
// the serial console. Run it with `make guestlab` or
// `go test -tags guestlab ./test/guestlab`; the image is built once into
// $BLOCKWIRE_GUESTLAB_DIR (default /var/tmp/blockwire-guestlab) from
// Debian's packages (build.sh) and reused while build.sh, init and run.sh
// are unchanged.
package guestlab

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/mutant"
)

// boots lists the scenarios, grouped by boot: one boot per RDMA flavour.
var boots = [][]string{
	{"linux-initiator-tcp", "linux-initiator-tcp-stall", "linux-initiator-tcp-chap", "linux-initiator-tcp-discovery-chap", "linux-initiator-tcp-digest", "linux-sg3-utils", "our-initiator-to-lio", "linux-nvme-tcp", "our-nvme-host-nvmet", "linux-nvme-ana"},
	{"siw-rdma", "linux-iser-siw", "our-iser-initiator", "linux-srp-siw", "linux-srp-siw-acl", "our-srp-initiator"},
	{"roce-rping", "linux-iser-rxe", "our-iser-initiator-lio", "linux-srp-rxe"},
	// blockwire on the kernel's RDMA devices through rdma-core (the verbs
	// build): rxe, then siw.
	{"verbs-rxe-linux-iser", "verbs-rxe-linux-iser-stall", "verbs-rxe-linux-srp", "verbs-rxe-our-iser-lio", "verbs-rxe-our-srp-lio", "verbs-rxe-soft-roce", "verbs-rxe-hostile", "verbs-rxe-forged-cm", "verbs-rxe-remove", "verbs-rxe-loss", "verbs-conformance"},
	{"verbs-siw-linux-iser", "verbs-siw-linux-srp", "verbs-siw-our-srp-lio", "verbs-siw-hostile", "verbs-siw-our-iser-lio", "verbs-siw-remove"},
	// 100 logins and logouts each, counting what blockwire holds.
	{"verbs-rxe-srp-cycles", "verbs-rxe-iser-cycles"},
	{"verbs-siw-srp-cycles", "verbs-siw-iser-cycles"},
	// The fault-injection harness (test/torture) with netem's faults;
	// then with power cuts under a file LUN (dm-log-writes).
	{"torture-netem"},
	{"power-cut"},
}

// benchBoots are the guest lab's benchmarks (BLOCKWIRE_GUESTLAB_BENCH=1):
// their figures are printed, not checked.
var benchBoots = [][]string{{"bench-verbs-rxe"}}

// extraDebs are Debian packages unpacked into the appended archive: tgt,
// the Linux-side iSER target for our initiator, and tcpdump, so a failing
// RoCE scenario can hand its traffic to tshark on the host, sg3-utils,
// and nvme-cli (the Linux NVMe host's tool).
var extraDebs = []string{"tgt", "libaio1", "tcpdump", "libpcap0.8", "libdbus-1-3", "sg3-utils", "libsgutils2-1.46-2",
	"nvme-cli", "libnvme1", "libjson-c5"}

func TestGuestLab(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "the guest lab needs root (apt-get, module build)")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		skipOrFail(t, "the guest lab builds its image from Debian's packages (apt-get)")
	}
	dir := os.Getenv("BLOCKWIRE_GUESTLAB_DIR")
	if dir == "" {
		dir = "/var/tmp/blockwire-guestlab"
	}
	image(t, dir)
	extra := extraCPIO(t, debs(t, dir))
	// BLOCKWIRE_GUESTLAB_ONLY=a,b runs only the named scenarios.
	only := map[string]bool{}
	for _, s := range strings.Split(os.Getenv("BLOCKWIRE_GUESTLAB_ONLY"), ",") {
		if s != "" {
			only[s] = true
		}
	}
	groups := boots
	if os.Getenv("BLOCKWIRE_GUESTLAB_BENCH") != "" {
		// Benchmarks, not tests: run on request (make guestlab-bench).
		groups = benchBoots
	}
	for _, all := range groups {
		var scenarios, tests []string
		for _, s := range all {
			if len(only) == 0 || only[s] {
				scenarios = append(scenarios, s)
				tests = append(tests, "/lab/"+s+".sh")
			}
		}
		if len(scenarios) == 0 {
			continue
		}
		start := time.Now()
		out, err := exec.Command("sh", "boot.sh", dir, strings.Join(tests, ","), extra).CombinedOutput()
		out = savePCAPs(t, out, filepath.Join(dir, "pcap"))
		t.Logf("boot with %v: %s", scenarios, time.Since(start).Round(time.Second))
		results := map[string]string{}
		for _, m := range resultRE.FindAllSubmatch(out, -1) {
			results[filepath.Base(strings.TrimSuffix(string(m[1]), ".sh"))] = string(m[2])
		}
		failed := false
		for _, s := range scenarios {
			rc, ok := results[s]
			switch {
			case !ok:
				t.Errorf("%s: no result (boot: %v)", s, err)
				failed = true
			case rc != "0":
				// Its own check lines first: the console below is long,
				// and a summary that keeps only the top says why.
				t.Errorf("%s: rc=%s\n%s", s, rc, says(out, s))
				failed = true
			default:
				t.Logf("%s: pass", s)
			}
		}
		if failed {
			t.Logf("console:\n%s", tail(out, 150))
		} else {
			// The evidence of a pass: each scenario's own check lines.
			var b strings.Builder
			for _, line := range strings.Split(string(out), "\n") {
				if evidenceRE.MatchString(line) {
					b.WriteString(strings.TrimSpace(line) + "\n")
				}
			}
			t.Logf("checks:\n%s", b.String())
		}
	}
}

// says returns the last 40 lines scenario s printed on the console
// (between its start and its result, the kernel's own lines left out), so
// a failure reads first why.
func says(out []byte, s string) string {
	var lines []string
	in := false
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.Contains(line, "===== test /lab/"+s+".sh start"):
			in = true
		case strings.Contains(line, "LAB-RESULT: /lab/"+s+".sh "):
			in = false
		case in && line != "" && !kernelRE.MatchString(line):
			lines = append(lines, "    "+line)
		}
	}
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

var (
	resultRE   = regexp.MustCompile(`LAB-RESULT: (\S+) rc=(\d+)`)
	kernelRE   = regexp.MustCompile(`^\[ *\d+\.\d+\] `)
	evidenceRE = regexp.MustCompile(`LAB\[|LAB: =====|IOPS=|verify: `)
)

func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// image builds the guest image unless one built from the same scripts is
// there.
func image(t *testing.T, dir string) {
	t.Helper()
	h := sha256.New()
	for _, f := range []string{"build.sh", "init", "run.sh"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	stamp := hex.EncodeToString(h.Sum(nil))
	stampFile := filepath.Join(dir, "stamp")
	if b, err := os.ReadFile(stampFile); err == nil && string(b) == stamp {
		if _, err := os.Stat(filepath.Join(dir, "initrd.img")); err == nil {
			return
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := exec.Command("bash", "build.sh", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("building the guest image: %v\n%s", err, tail(out, 40))
	}
	t.Logf("guest image built in %s", time.Since(start).Round(time.Second))
	os.WriteFile(stampFile, []byte(stamp), 0o644)
}

// debs downloads the extra packages into the image directory once.
func debs(t *testing.T, dir string) []string {
	t.Helper()
	dd := filepath.Join(dir, "extra-debs")
	var out []string
	for _, p := range extraDebs {
		m, _ := filepath.Glob(filepath.Join(dd, p+"_*.deb"))
		if len(m) == 0 {
			os.MkdirAll(dd, 0o755)
			cmd := exec.Command("apt-get", "download", p)
			cmd.Dir = dd
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("apt-get download %s: %v\n%s", p, err, b)
			}
			m, _ = filepath.Glob(filepath.Join(dd, p+"_*.deb"))
		}
		out = append(out, m...)
	}
	return out
}

// extraCPIO packs a static blockwire, the extra packages and the scenario
// scripts into a cpio archive appended to the initrd.
func extraCPIO(t *testing.T, debs []string) string {
	t.Helper()
	tmp := t.TempDir()
	root := filepath.Join(tmp, "root")
	if err := os.MkdirAll(filepath.Join(root, "lab", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range debs {
		if out, err := exec.Command("dpkg-deb", "-x", d, root).CombinedOutput(); err != nil {
			t.Fatalf("dpkg-deb -x %s: %v\n%s", d, err, out)
		}
	}
	// The base root is usr-merged: a real top-level lib/ in the appended
	// archive would shadow its symlink; tgtd's socket lives in /var/run.
	fix := "if [ -d lib ]; then mkdir -p usr/lib && cp -a lib/. usr/lib/ && rm -rf lib; fi; " +
		"if [ -d sbin ]; then mkdir -p usr/sbin && cp -a sbin/. usr/sbin/ && rm -rf sbin; fi; " +
		"rm -rf usr/share/doc usr/share/man etc/init.d; mkdir -p var; ln -sfn /run var/run"
	cmd := exec.Command("sh", "-c", fix)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("arranging the extra packages: %v\n%s", err, out)
	}
	// forgecm asks for connections with a forged RDMA/CM header.
	// logreplay replays a dm-log-writes log to a power cut.
	for bin, pkg := range map[string]string{"blockwire": "../../cmd/blockwire", "gorping": "./rping", "torture": "../torture", "forgecm": "./forgecm",
		"logreplay": "./logreplay"} {
		build := exec.Command("go", "build", "-o", filepath.Join(root, "lab", "bin", bin), pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", bin, err, out)
		}
	}
	// blockwire-nosync: a deliberate bug the power cut must catch — the
	// file backend never syncs (Flush does nothing, a durable write is a
	// plain one). go build -overlay replaces the source file, so nothing
	// in the product can switch it on; when the code it replaces changes,
	// the build fails until the mutation is brought up to date.
	nosync, err := mutant.Overlay(tmp, "../../backend/file/file.go", map[string]string{
		"\tn, err := b.write(p, off, unix.RWF_DSYNC)\n": "\tn, err := b.write(p, off, 0)\n",
		"\t\terr := syscall.Fdatasync(b.fd)\n":          "\t\tvar err error\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-overlay", nosync, "-o", filepath.Join(root, "lab", "bin", "blockwire-nosync"), "../../cmd/blockwire")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building blockwire-nosync: %v\n%s", err, out)
	}
	// The verbs build: cgo against rdma-core (libibverbs, librdmacm),
	// linked dynamically to the guest's own copies of them.
	// hostile is a hostile RDMA peer on the same device.
	for bin, pkg := range map[string]string{"blockwire-verbs": "../../cmd/blockwire", "hostile": "./hostile"} {
		build := exec.Command("go", "build", "-tags", "verbs", "-o", filepath.Join(root, "lab", "bin", bin), pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building %s (needs libibverbs-dev and librdmacm-dev): %v\n%s", bin, err, out)
		}
	}
	// The datamover conformance suite (fabric's test binary, verbs build)
	// for the kernel's devices: verbs-conformance.
	build = exec.Command("go", "test", "-c", "-tags", "verbs", "-o", filepath.Join(root, "lab", "bin", "fabric-verbs.test"), "../../fabric")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the fabric tests (verbs): %v\n%s", err, out)
	}
	scripts, _ := filepath.Glob("scenarios/*.sh")
	for _, s := range scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "lab", filepath.Base(s)), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(tmp, "extra.cpio.gz")
	pack := exec.Command("sh", "-c", "find . | cpio -o -H newc --quiet | gzip > "+out)
	pack.Dir = root
	if b, err := pack.CombinedOutput(); err != nil {
		t.Fatalf("cpio: %v\n%s", err, b)
	}
	return out
}

// savePCAPs writes the captures a failing scenario printed on the console
// (gzip + base64 between "=====PCAP-BEGIN name" and "=====PCAP-END") to
// dir/name.pcap.gz, and returns the console without them.
func savePCAPs(t *testing.T, console []byte, dir string) []byte {
	var rest, b64 bytes.Buffer
	name := ""
	for _, line := range strings.SplitAfter(string(console), "\n") {
		l := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(l, "=====PCAP-BEGIN "):
			name, _ = strings.CutPrefix(l, "=====PCAP-BEGIN ")
			b64.Reset()
		case name != "" && l == "=====PCAP-END":
			gz, err := base64.StdEncoding.DecodeString(b64.String())
			if err == nil {
				os.MkdirAll(dir, 0o755)
				f := filepath.Join(dir, filepath.Base(name)+".pcap.gz")
				if err = os.WriteFile(f, gz, 0o644); err == nil {
					t.Logf("%s: capture in %s", name, f)
				}
			}
			if err != nil {
				t.Logf("%s: capture unreadable: %v", name, err)
			}
			name = ""
		case name != "":
			b64.WriteString(l)
		default:
			rest.WriteString(line)
		}
	}
	return rest.Bytes()
}

func tail(b []byte, n int) string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, strings.TrimRight(sc.Text(), "\r"))
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return fmt.Sprint(strings.Join(lines, "\n"))
}

func TestSays(t *testing.T) {
	out := []byte("LAB: ===== test /lab/a.sh start uptime 1.0s\n" +
		"LAB[1.10]: a said this\n" +
		"LAB-RESULT: /lab/a.sh rc=0 uptime 1.2s\n" +
		"LAB: ===== test /lab/b.sh start uptime 1.2s\n" +
		"[    1.300000] a kernel line\n" +
		"time=x level=WARN msg=\"a warning b grepped\"\n" +
		"LAB[1.40]: the portal did not come back\n" +
		"LAB-RESULT: /lab/b.sh rc=1 uptime 1.5s\n")
	got := says(out, "b")
	want := "    time=x level=WARN msg=\"a warning b grepped\"\n    LAB[1.40]: the portal did not come back"
	if got != want {
		t.Fatalf("says(b) = %q, want %q", got, want)
	}
}
