package interop

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/nvme/dhchap"
	"github.com/blockwire/blockwire/nvme/tcphost"
)

// SPDK as an NVMe/TCP peer: its userspace host tools (spdk_nvme_identify,
// spdk_nvme_perf) against blockwire's target, and blockwire's host against
// its nvmf_tgt. SPDK is not a Debian package and may not be built by CI
// (its sources come only from a session's fetch), so these run when asked:
//
//	BLOCKWIRE_LONG=1 BLOCKWIRE_SPDK=1 go test -run SPDK ./test/interop
//
// with SPDK built as ../shared/anchors/spdk/README.md says, under
// $SPDK_HOME (default ~/spdk). Asked and not built, they fail.

// spdk returns SPDK's tree (SPDK_HOME/src) and its anchor scripts
// directory, or skips when not asked for.
func spdk(t *testing.T) (src, anchor string) {
	t.Helper()
	long(t)
	if os.Getenv("BLOCKWIRE_SPDK") == "" {
		t.Skip("SPDK: BLOCKWIRE_SPDK=1 runs it, with SPDK built under $SPDK_HOME (../shared/anchors/spdk/README.md)")
	}
	home := os.Getenv("SPDK_HOME")
	if home == "" {
		home = filepath.Join(os.Getenv("HOME"), "spdk")
	}
	src, anchor = filepath.Join(home, "src"), filepath.Join(home, "anchor")
	for _, f := range []string{filepath.Join(src, "build/bin/spdk_nvme_perf"), filepath.Join(src, "build/bin/spdk_nvme_identify"),
		filepath.Join(src, "build/bin/nvmf_tgt"), filepath.Join(anchor, "nvmf-up.sh")} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("BLOCKWIRE_SPDK is set but SPDK is not built: %v", err)
		}
	}
	return src, anchor
}

// spdkTool runs one of SPDK's host tools (without hugepages, as the
// anchor runs) on core 0.
func spdkTool(t *testing.T, src string, timeout time.Duration, tool string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "taskset", append([]string{"-c", "0", filepath.Join(src, "build/bin", tool)}, args...)...)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+strings.Join([]string{filepath.Join(src, "build/lib"),
		filepath.Join(src, "isa-l/.libs"), filepath.Join(src, "isa-l-crypto/.libs")}, ":"))
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s timed out after %v", tool, timeout)
	}
	return string(out), err
}

// TestSPDKHostToolsAgainstOurTarget: spdk_nvme_identify reads the
// discovery log and the subsystem's controller and namespace as
// blockwire reports them; spdk_nvme_perf runs random reads and writes,
// 4 KiB and 128 KiB, with and without digests, with no I/O error; no
// controller is left once it ended.
func TestSPDKHostToolsAgainstOurTarget(t *testing.T) {
	src, _ := spdk(t)
	nvAddr := freePort(t)
	sock := filepath.Join(t.TempDir(), "admin.sock")
	serve(t, "--nvme-listen", nvAddr, "--size", "1GiB", "--iser=false", "--admin-socket", sock)
	host, port, _ := strings.Cut(nvAddr, ":")
	nqn := "nqn.2026-11.io.blockwire:iqn.2026-11.org.blockwire:default"
	disc := fmt.Sprintf("trtype:TCP adrfam:IPv4 traddr:%s trsvcid:%s", host, port)
	sub := disc + " subnqn:" + nqn

	out, err := spdkTool(t, src, time.Minute, "spdk_nvme_identify", "-r", disc, "--no-huge", "-s", "256")
	if err != nil {
		t.Fatalf("spdk_nvme_identify of the discovery controller: %v\n%s", err, out)
	}
	if !strings.Contains(out, "NVM Subsystem Qualified Name:          "+nqn) || !strings.Contains(out, "Transport Service Identifier:          "+port) {
		t.Fatalf("spdk_nvme_identify: the discovery log lacks %s on port %s:\n%s", nqn, port, out)
	}
	out, err = spdkTool(t, src, time.Minute, "spdk_nvme_identify", "-r", sub, "--no-huge", "-s", "256")
	if err != nil {
		t.Fatalf("spdk_nvme_identify of the subsystem: %v\n%s", err, out)
	}
	for _, want := range []string{"Model Number:                          blockwire", "Reservations:                Supported",
		"Fused Compare & Write:       Supported", "Dataset Management Command:  Supported", "Volatile Write Cache:        Present",
		"Size (in LBAs):                        2097152 (1GiB)", "Deallocated Read Value:                All 0x00",
		"Reservation Register (0Dh): Supported", "Namespace Sharing Capabilities:        Multiple Controllers"} {
		if !strings.Contains(out, want) {
			t.Errorf("spdk_nvme_identify: no %q in\n%s", want, out)
		}
	}

	iops := regexp.MustCompile(`(?m)^Total\s*:\s*([0-9.]+)\s+([0-9.]+)`)
	for _, run := range []struct {
		name string
		args []string
	}{
		{"4 KiB random read/write QD 32", []string{"-q", "32", "-o", "4096", "-w", "randrw", "-M", "50"}},
		{"128 KiB sequential write QD 8", []string{"-q", "8", "-o", "131072", "-w", "write"}},
		{"128 KiB sequential read QD 8", []string{"-q", "8", "-o", "131072", "-w", "read"}},
		{"4 KiB random read/write QD 16, header and data digests", []string{"-q", "16", "-o", "4096", "-w", "randrw", "-M", "50", "-H", "-I"}},
		{"4 KiB random write QD 16, 4 queues", []string{"-q", "16", "-o", "4096", "-w", "randwrite", "-P", "4"}},
	} {
		args := append([]string{"-r", sub, "-t", "2", "-c", "0x1", "--no-huge", "-s", "1024"}, run.args...)
		out, err := spdkTool(t, src, time.Minute, "spdk_nvme_perf", args...)
		m := iops.FindStringSubmatch(out)
		if err != nil || m == nil || perfErrors(out) != "" {
			t.Fatalf("spdk_nvme_perf, %s: %v\n%s", run.name, err, out)
		}
		if v, _ := strconv.ParseFloat(m[1], 64); v <= 0 {
			t.Fatalf("spdk_nvme_perf, %s: %s IOPS\n%s", run.name, m[1], out)
		}
		t.Logf("spdk_nvme_perf, %s: %s IOPS, %s MiB/s", run.name, m[1], m[2])
	}
	// Nothing left behind: the controllers ended with the tool.
	deadline := time.Now().Add(5 * time.Second)
	for {
		out := mustRun(t, 10*time.Second, binary, "admin", "--socket", sock, "sessions")
		if !strings.Contains(out, "nvme") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("controllers left after spdk_nvme_perf ended:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// perfErrors is the error lines spdk_nvme_perf printed, but the one it
// prints as it tears its queues down against any target (SPDK's own
// too): a completion poll of the disconnected queue.
func perfErrors(out string) string {
	var b strings.Builder
	for line := range strings.Lines(out) {
		if strings.Contains(line, "*ERROR*") && !strings.Contains(line, "DISCONNECTED] CQ transport error -6") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// TestOurHostAgainstSPDKTarget: blockwire's NVMe/TCP host against SPDK's
// nvmf_tgt — discovery, identify, writes read back (with and without
// digests, on several queues), compare, fused compare-and-write, write
// zeroes, deallocate, flush, and reservations (register, acquire, report,
// another host refused, release, unregister).
func TestOurHostAgainstSPDKTarget(t *testing.T) {
	_, anchor := spdk(t)
	port := strings.Split(freePort(t), ":")[1]
	cmd := exec.Command(filepath.Join(anchor, "nvmf-up.sh"), port, "64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nvmf-up.sh: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(filepath.Join(anchor, "nvmf-down.sh"), port).CombinedOutput(); err != nil {
			t.Errorf("nvmf-down.sh: %v\n%s", err, out)
		}
	})
	addr := "127.0.0.1:" + port
	const nqn = "nqn.2016-06.io.spdk:anchor"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	es, err := tcphost.Discover(ctx, addr, tcphost.Options{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range es {
		found = found || e.SubNQN == nqn && e.Addr == addr
	}
	if !found {
		t.Fatalf("SPDK's discovery log %+v lacks %s at %s", es, nqn, addr)
	}
	for _, o := range []tcphost.Options{{IOQueues: 2}, {HeaderDigest: true, DataDigest: true, QueueSize: 64}} {
		c, err := tcphost.Connect(ctx, addr, nqn, o)
		if err != nil {
			t.Fatalf("connect %+v: %v", o, err)
		}
		ns, err := c.Namespace(ctx, 1)
		if err != nil || ns.Blocks != 64<<20/512 || ns.BlockSize != 512 {
			c.Close()
			t.Fatalf("namespace 1: %+v, %v; want 64 MiB of 512-byte blocks", ns, err)
		}
		p := make([]byte, 128<<10)
		rand.Read(p)
		got := make([]byte, len(p))
		for _, lba := range []uint64{0, 4096, 131072 - 256} {
			if err := c.Write(ctx, 1, 512, lba, p, lba == 0); err != nil {
				t.Fatal(err)
			}
			if err := c.Read(ctx, 1, 512, lba, got); err != nil || !bytes.Equal(got, p) {
				t.Fatalf("read back at %d: %v, equal %v", lba, err, bytes.Equal(got, p))
			}
		}
		c.Close()
	}

	a, err := tcphost.Connect(ctx, addr, nqn, tcphost.Options{HostID: [16]byte{0xa1}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	blk := make([]byte, 4096)
	rand.Read(blk)
	if err := a.Write(ctx, 1, 512, 64, blk, false); err != nil {
		t.Fatal(err)
	}
	if err := a.Compare(ctx, 1, 512, 64, blk); err != nil {
		t.Fatalf("compare of the same data: %v", err)
	}
	other := bytes.Clone(blk)
	other[7] ^= 1
	var se *tcphost.StatusError
	if err := a.Compare(ctx, 1, 512, 64, other); !errors.As(err, &se) || se.Status.SCT() != 2 || se.Status.SC() != 0x85 {
		t.Fatalf("compare of other data: %v, want Compare Failure", err)
	}
	if err := a.CompareAndWrite(ctx, 1, 512, 64, blk[:512], other[:512], false); err != nil {
		t.Fatalf("fused compare and write: %v", err)
	}
	if err := a.CompareAndWrite(ctx, 1, 512, 64, blk[:512], blk[:512], false); !errors.As(err, &se) || se.Status.SC() != 0x85 {
		t.Fatalf("fused compare and write of stale data: %v, want Compare Failure", err)
	}
	got := make([]byte, 512)
	if err := a.Read(ctx, 1, 512, 64, got); err != nil || !bytes.Equal(got, other[:512]) {
		t.Fatalf("after compare and write: %v, equal %v", err, bytes.Equal(got, other[:512]))
	}
	if err := a.WriteZeroes(ctx, 1, 64, 8, false); err != nil {
		t.Fatal(err)
	}
	if err := a.Read(ctx, 1, 512, 64, got); err != nil || !bytes.Equal(got, make([]byte, 512)) {
		t.Fatalf("after write zeroes: %v, %x", err, got[:16])
	}
	if err := a.Deallocate(ctx, 1, 128, 64); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx, 1); err != nil {
		t.Fatal(err)
	}

	// Reservations: A registers and takes Write Exclusive; B is refused
	// a write and allowed a read; the report shows A holding it.
	if err := a.ResvRegister(ctx, 1, tcphost.ResvRegister, 0, 0xa1a1, false, 0); err != nil {
		t.Fatalf("register: %v", err)
	}
	if err := a.ResvAcquire(ctx, 1, 0, 1, 0xa1a1, 0); err != nil {
		t.Fatalf("acquire: %v", err)
	}
	st, err := a.ResvReport(ctx, 1)
	if err != nil || st.Type != 1 || len(st.Registrants) != 1 || !st.Registrants[0].Holder || st.Registrants[0].Key != 0xa1a1 ||
		st.Registrants[0].HostID != [16]byte{0xa1} || st.Registrants[0].CNTLID != a.ID() {
		t.Fatalf("report %+v, %v: want A holding Write Exclusive", st, err)
	}
	b, err := tcphost.Connect(ctx, addr, nqn, tcphost.Options{HostID: [16]byte{0xb2}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Write(ctx, 1, 512, 64, blk, false); !errors.As(err, &se) || se.Status.SCT() != 0 || se.Status.SC() != 0x83 {
		t.Fatalf("another host's write under Write Exclusive: %v, want Reservation Conflict", err)
	}
	if err := b.Read(ctx, 1, 512, 64, blk); err != nil {
		t.Fatalf("another host's read under Write Exclusive: %v", err)
	}
	if err := a.ResvRelease(ctx, 1, 1, 0xa1a1, false); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := a.ResvRegister(ctx, 1, tcphost.ResvUnregister, 0xa1a1, 0, false, 0); err != nil {
		t.Fatalf("unregister: %v", err)
	}
	if st, err := b.ResvReport(ctx, 1); err != nil || st.Type != 0 || len(st.Registrants) != 0 {
		t.Fatalf("report after release and unregister %+v, %v: want nothing", st, err)
	}
	if err := b.Write(ctx, 1, 512, 64, blk, false); err != nil {
		t.Fatalf("B's write once released: %v", err)
	}
}

// TestSPDKDHCHAP: DH-HMAC-CHAP against SPDK both ways. SPDK's
// spdk_nvme_perf authenticates to blockwire's target with the host's
// secret (one way) and with the controller's too (both ways), and is
// refused with another secret or none; blockwire's host (the CLI)
// authenticates the same way. blockwire's host authenticates to SPDK's
// nvmf_tgt, one way and both, and refuses a controller that cannot prove
// the controller's secret.
func TestSPDKDHCHAP(t *testing.T) {
	src, anchor := spdk(t)
	const host = "nqn.2026-11.org.blockwire:spdk-host"
	dir := t.TempDir()
	hk, ck, wrong := dhchap.NewSecret(32, dhchap.SHA256), dhchap.NewSecret(48, dhchap.SHA384), dhchap.NewSecret(32, 0)
	for name, k := range map[string]dhchap.Secret{"host.key": hk, "ctrl.key": ck, "wrong.key": wrong} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(k.String()+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	nvAddr := freePort(t)
	cfg := filepath.Join(dir, "blockwire.toml")
	os.WriteFile(cfg, []byte(`nvme_listen = ["`+nvAddr+`"]
[[target]]
name = "iqn.2026-11.org.blockwire:auth"
[[target.acl]]
host = "`+host+`"
  [target.acl.dhchap]
  secret_file = "host.key"
  [target.acl.dhchap_ctrl]
  secret_file = "ctrl.key"
[[target.lun]]
id = 0
size = "64MiB"
`), 0o600)
	serve(t, "--config", cfg)
	h, port, _ := strings.Cut(nvAddr, ":")
	nqn := "nqn.2026-11.io.blockwire:iqn.2026-11.org.blockwire:auth"
	trid := fmt.Sprintf("trtype:TCP adrfam:IPv4 traddr:%s trsvcid:%s subnqn:%s hostnqn:%s", h, port, nqn, host)
	perf := func(keys ...string) (string, error) {
		args := append([]string{"-r", trid, "-q", "8", "-o", "4096", "-w", "randrw", "-M", "50", "-t", "1", "-c", "0x1", "--no-huge", "-s", "512"}, keys...)
		return spdkTool(t, src, time.Minute, "spdk_nvme_perf", args...)
	}
	for _, keys := range [][]string{{"--dhchap-key", filepath.Join(dir, "host.key")},
		{"--dhchap-key", filepath.Join(dir, "host.key"), "--dhchap-ctrlr-key", filepath.Join(dir, "ctrl.key")}} {
		out, err := perf(keys...)
		if err != nil || !strings.Contains(out, "Total") || perfErrors(out) != "" {
			t.Fatalf("spdk_nvme_perf %v: %v\n%s", keys, err, out)
		}
	}
	for _, keys := range [][]string{{"--dhchap-key", filepath.Join(dir, "wrong.key")}, nil,
		{"--dhchap-key", filepath.Join(dir, "host.key"), "--dhchap-ctrlr-key", filepath.Join(dir, "wrong.key")}} {
		if out, err := perf(keys...); err == nil && strings.Contains(out, "Total") {
			t.Fatalf("spdk_nvme_perf %v got in:\n%s", keys, out)
		}
	}
	url := "nvme+tcp://" + nvAddr + "/" + nqn + "/1"
	out, code := blockwire(t, "read", "--initiator-name", host, "--dhchap-secret-file", filepath.Join(dir, "host.key"),
		"--dhchap-ctrl-secret-file", filepath.Join(dir, "ctrl.key"), "--length", "4096", "--out", filepath.Join(dir, "r"), url)
	if code != 0 {
		t.Fatalf("blockwire read with both secrets: exit %d\n%s", code, out)
	}

	// blockwire's host against SPDK's nvmf_tgt.
	sport := strings.Split(freePort(t), ":")[1]
	if out, err := exec.Command(filepath.Join(anchor, "nvmf-up.sh"), sport, "64").CombinedOutput(); err != nil {
		t.Fatalf("nvmf-up.sh: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command(filepath.Join(anchor, "nvmf-down.sh"), sport).Run() })
	home := filepath.Dir(src)
	rpc := func(args ...string) {
		t.Helper()
		argv := append([]string{filepath.Join(src, "scripts/rpc.py"), "-s", filepath.Join(home, "run", "nvmf-"+sport+".sock")}, args...)
		if out, err := exec.Command("/usr/bin/python3", argv...).CombinedOutput(); err != nil {
			t.Fatalf("rpc.py %v: %v\n%s", args, err, out)
		}
	}
	const snqn = "nqn.2016-06.io.spdk:anchor"
	rpc("keyring_file_add_key", "hk", filepath.Join(dir, "host.key"))
	rpc("keyring_file_add_key", "ck", filepath.Join(dir, "ctrl.key"))
	rpc("nvmf_subsystem_allow_any_host", "--no-allow-any-host", snqn)
	rpc("nvmf_subsystem_add_host", snqn, host, "--dhchap-key", "hk", "--dhchap-ctrlr-key", "ck")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr := "127.0.0.1:" + sport
	for _, o := range []tcphost.Options{{HostNQN: host, DHCHAP: &hk}, {HostNQN: host, DHCHAP: &hk, DHCHAPCtrl: &ck, IOQueues: 2}} {
		c, err := tcphost.Connect(ctx, addr, snqn, o)
		if err != nil {
			t.Fatalf("our host to nvmf_tgt (controller secret %v): %v", o.DHCHAPCtrl != nil, err)
		}
		p := make([]byte, 8192)
		rand.Read(p)
		got := make([]byte, len(p))
		if err := c.Write(ctx, 1, 512, 0, p, false); err != nil {
			t.Fatal(err)
		}
		if err := c.Read(ctx, 1, 512, 0, got); err != nil || !bytes.Equal(got, p) {
			t.Fatalf("read back: %v", err)
		}
		c.Close()
	}
	if c, err := tcphost.Connect(ctx, addr, snqn, tcphost.Options{HostNQN: host, DHCHAP: &hk, DHCHAPCtrl: &wrong}); !errors.Is(err, tcphost.ErrAuthentication) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("a controller proving another secret: %v, want our host to refuse it", err)
	}
	if c, err := tcphost.Connect(ctx, addr, snqn, tcphost.Options{HostNQN: host, DHCHAP: &wrong}); err == nil {
		c.Close()
		t.Fatal("nvmf_tgt admitted another secret")
	}
}
