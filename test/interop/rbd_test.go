//go:build rbd

package interop

import (
	"context"
	be "encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/scsi"
)

// The RBD tests need a Ceph cluster: BLOCKWIRE_CEPH_CONF names
// its ceph.conf (.ci/run starts a throwaway one with test/ceph/up.sh).
// Built with the rbd tag and no cluster is a failure, not a skip.
func cephConf(t *testing.T) string {
	t.Helper()
	conf := os.Getenv("BLOCKWIRE_CEPH_CONF")
	if conf == "" {
		t.Fatal("BLOCKWIRE_CEPH_CONF is not set: start a cluster with test/ceph/up.sh DIR and point it at DIR/ceph.conf")
	}
	need(t, "rbd", "ceph")
	return conf
}

// rbdImage creates a fresh image with Debian's rbd tool.
func rbdImage(t *testing.T, conf, size string) string {
	t.Helper()
	if out, _ := run(t, time.Minute, "ceph", "-c", conf, "osd", "pool", "ls"); !strings.Contains(out, "rbd\n") {
		mustRun(t, time.Minute, "ceph", "-c", conf, "osd", "pool", "create", "rbd", "8")
		mustRun(t, time.Minute, "rbd", "-c", conf, "pool", "init", "rbd")
	}
	name := fmt.Sprintf("it%d", rand.Uint64())
	mustRun(t, time.Minute, "rbd", "-c", conf, "create", "--size", size, "rbd/"+name)
	t.Cleanup(func() { exec.Command("rbd", "-c", conf, "rm", "--no-progress", "rbd/"+name).Run() })
	return "rbd/" + name
}

// TestRBDLikeAFile: a LUN on RBD passes the real-peer checks the memory
// and file LUNs pass — libiscsi's tools, a qemu-img round trip, and
// iscsi-test-cu's read, write, unmap, write-same and compare-and-write
// families with the outcomes testdata/iscsi-test-cu.expected lists.
func TestRBDLikeAFile(t *testing.T) {
	long(t)
	conf := cephConf(t)
	need(t, "iscsi-inq", "iscsi-readcapacity16", "iscsi-test-cu", "qemu-img")
	img := rbdImage(t, conf, "256M")
	d := serve(t, "--target-reset", "--rbd", img, "--ceph-conf", conf)
	url := d.url(defaultIQN, 0)
	if out := mustRun(t, time.Minute, "iscsi-readcapacity16", url); !strings.Contains(out, "Total size:268435456") {
		t.Fatalf("READ CAPACITY(16) of a 256 MiB image:\n%s", out)
	}
	mustRun(t, time.Minute, "iscsi-inq", url)

	src := randomImage(t, 32<<20)
	back := filepath.Join(t.TempDir(), "back.img")
	mustRun(t, 2*time.Minute, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, url)
	mustRun(t, 2*time.Minute, "qemu-img", "dd", "-f", "raw", "-O", "raw", "bs=1M", "count=32", "if="+url, "of="+back)
	sameFirst(t, src, back, 32<<20)
	// The data is in the cluster: Debian's rbd tool reads it back.
	exported := filepath.Join(t.TempDir(), "exported.img")
	mustRun(t, 2*time.Minute, "rbd", "-c", conf, "export", "--no-progress", img, exported)
	sameFirst(t, src, exported, 32<<20)

	families := []string{"Read10", "Read12", "Read16", "Write10", "Write12", "Write16", "WriteVerify10", "WriteVerify16",
		"Unmap", "WriteSame10", "WriteSame16", "CompareAndWrite", "OrWrite", "SyncCache10", "SyncCache16", "GetLBAStatus"}
	var tests []string
	for _, f := range families {
		tests = append(tests, "SCSI."+f)
	}
	out, _ := run(t, 10*time.Minute, "iscsi-test-cu", "--dataloss", "--test="+strings.Join(tests, ","), url)
	got := cuOutcomes(t, " (RBD LUN)", out)
	want := expectedCu(t)
	n := 0
	for name, outcome := range got {
		n++
		w, ok := want[name]
		switch {
		case !ok:
			t.Errorf("%s: %s on RBD, not in the expected list", name, outcome)
		case w != outcome:
			t.Errorf("%s: %s on RBD, %s on a memory LUN", name, outcome, w)
		}
	}
	if n < 50 {
		t.Fatalf("only %d iscsi-test-cu tests ran:\n%s", n, tail(out, 30))
	}
	t.Logf("iscsi-test-cu on an RBD LUN: %d tests, outcomes as on a memory LUN", n)
	if t.Failed() {
		t.Log(failures(out))
	}
}

func expectedCu(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("testdata/iscsi-test-cu.expected")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, outcome, _ := strings.Cut(line, " ")
		m[name] = outcome
	}
	return m
}

// gateway starts a blockwire serving img as target port group tpgt of
// two (1 active/optimized, 2 active/non-optimized).
func gateway(t *testing.T, conf, img string, tpgt int) *daemon {
	return serve(t, "--target-reset", "--rbd", img, "--ceph-conf", conf, "--tpgt", fmt.Sprint(tpgt), "--port-groups", "1=active-optimized,2=active-non-optimized")
}

// TestRBDTwoGateways: two blockwire processes serve one image as one LU
// with two target port groups. libiscsi's MultipathIO family, with one URL
// per gateway, passes; REPORT TARGET PORT GROUPS shows both groups; a
// reservation taken through A is enforced through B.
func TestRBDTwoGateways(t *testing.T) {
	long(t)
	conf := cephConf(t)
	need(t, "iscsi-test-cu")
	img := rbdImage(t, conf, "256M")
	a, b := gateway(t, conf, img, 1), gateway(t, conf, img, 2)

	out, _ := run(t, 5*time.Minute, "iscsi-test-cu", "--dataloss", "--test=SCSI.MultipathIO", a.url(defaultIQN, 0), b.url(defaultIQN, 0))
	if !strings.Contains(out, "found matching LU device identifier for all (2) paths") {
		t.Fatalf("libiscsi did not see one LU on both gateways:\n%s", tail(out, 30))
	}
	got := cuOutcomes(t, " (two gateways)", out)
	for _, name := range []string{"MultipathIO.Simple", "MultipathIO.Reset", "MultipathIO.CompareAndWrite", "MultipathIO.CompareAndWriteAsync"} {
		if got[name] != "pass" {
			t.Errorf("%s: %s", name, got[name])
		}
	}
	if t.Failed() {
		t.Fatal(failures(out))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	open := func(d *daemon, name string) *initiator.Device {
		dev, err := initiator.Open(ctx, d.url(defaultIQN, 0), initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		// The power-on unit attention first.
		dev.Do(ctx, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil, nil)
		return dev
	}
	x := open(a, "iqn.2026-11.org.blockwire:x")
	y := open(b, "iqn.2026-11.org.blockwire:y")

	// REPORT TARGET PORT GROUPS through B: two groups, A's optimized.
	rtpg := make([]byte, 64)
	if _, err := y.Do(ctx, []byte{scsi.OpMaintenanceIn, scsi.SAReportTargetPortGroups, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0}, nil, rtpg); err != nil {
		t.Fatalf("REPORT TARGET PORT GROUPS: %v", err)
	}
	if be.BigEndian.Uint32(rtpg) != 24 || rtpg[4]&0x0f != 0 || be.BigEndian.Uint16(rtpg[6:]) != 1 ||
		rtpg[16]&0x0f != 1 || be.BigEndian.Uint16(rtpg[18:]) != 2 {
		t.Fatalf("REPORT TARGET PORT GROUPS: % x", rtpg[:28])
	}

	// Explicit ALUA: SET TARGET PORT GROUPS through A puts A's group in
	// standby and B's optimized; B reports it (the states live in the
	// image's shared record), set explicitly (status code 01h).
	stpg := []byte{0, 0, 0, 0, byte(scsi.Standby), 0, 0, 1, byte(scsi.ActiveOptimized), 0, 0, 2}
	if _, err := x.Do(ctx, []byte{scsi.OpMaintenanceOut, scsi.SASetTargetPortGroups, 0, 0, 0, 0, 0, 0, 0, byte(len(stpg)), 0, 0}, stpg, nil); err != nil {
		t.Fatalf("SET TARGET PORT GROUPS through A: %v", err)
	}
	y.Do(ctx, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil, nil) // ASYMMETRIC ACCESS STATE CHANGED
	if _, err := y.Do(ctx, []byte{scsi.OpMaintenanceIn, scsi.SAReportTargetPortGroups, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0}, nil, rtpg); err != nil {
		t.Fatalf("REPORT TARGET PORT GROUPS: %v", err)
	}
	if rtpg[4]&0x0f != byte(scsi.Standby) || rtpg[9] != 0x01 || rtpg[16]&0x0f != byte(scsi.ActiveOptimized) || rtpg[21] != 0x01 {
		t.Fatalf("REPORT TARGET PORT GROUPS through B after SET TARGET PORT GROUPS through A: % x", rtpg[:28])
	}
	// And back, for what follows (A's group in standby refuses I/O).
	stpg[4], stpg[8] = byte(scsi.ActiveOptimized), byte(scsi.ActiveNonOptimized)
	if _, err := y.Do(ctx, []byte{scsi.OpMaintenanceOut, scsi.SASetTargetPortGroups, 0, 0, 0, 0, 0, 0, 0, byte(len(stpg)), 0, 0}, stpg, nil); err != nil {
		t.Fatalf("SET TARGET PORT GROUPS through B: %v", err)
	}
	x.Do(ctx, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil, nil)

	pr := func(dev *initiator.Device, sa, typ byte, key, saKey uint64) error {
		p := make([]byte, 24)
		be.BigEndian.PutUint64(p[0:], key)
		be.BigEndian.PutUint64(p[8:], saKey)
		_, err := dev.Do(ctx, []byte{scsi.OpPersistentReserveOut, sa, typ, 0, 0, 0, 0, 0, 24, 0}, p, nil)
		return err
	}
	write := func(dev *initiator.Device) error {
		_, err := dev.Do(ctx, []byte{scsi.OpWrite10, 0, 0, 0, 0, 8, 0, 0, 1, 0}, make([]byte, 512), nil)
		return err
	}
	conflict := func(err error) bool {
		var se *initiator.SCSIError
		return errors.As(err, &se) && se.Status == scsi.StatusReservationConflict
	}
	if err := pr(x, 0, 0, 0, 0x1111); err != nil { // REGISTER through A
		t.Fatal(err)
	}
	if err := pr(y, 0, 0, 0, 0x2222); err != nil { // REGISTER through B
		t.Fatal(err)
	}
	if err := pr(x, 1, 3, 0x1111, 0); err != nil { // RESERVE Exclusive Access through A
		t.Fatal(err)
	}
	if err := write(y); !conflict(err) {
		t.Fatalf("write through B under A's Exclusive Access reservation: %v", err)
	}
	if err := write(x); err != nil {
		t.Fatalf("write by the holder through A: %v", err)
	}
	if err := pr(x, 2, 3, 0x1111, 0); err != nil { // RELEASE through A
		t.Fatal(err)
	}
	if err := write(y); err != nil {
		t.Fatalf("write through B after A released: %v", err)
	}
	// The reservation state lives in the cluster, not in A: a third
	// gateway started now sees the registrations.
	c := gateway(t, conf, img, 1)
	z := open(c, "iqn.2026-11.org.blockwire:z")
	keys := make([]byte, 64)
	if _, err := z.Do(ctx, []byte{scsi.OpPersistentReserveIn, 0, 0, 0, 0, 0, 0, 0, 64, 0}, nil, keys); err != nil {
		t.Fatal(err)
	}
	if be.BigEndian.Uint32(keys[4:]) != 16 {
		t.Fatalf("READ KEYS through a new gateway: % x", keys[:24])
	}
}

// TestRBDGatewayDiesUnderLoad: our initiator writes and verifies through
// gateway A with gateway B as a second path; A is killed (SIGKILL) in the
// middle. The initiator fails over to B, replays what was in flight, and
// every acknowledged write reads back.
func TestRBDGatewayDiesUnderLoad(t *testing.T) {
	long(t)
	conf := cephConf(t)
	img := rbdImage(t, conf, "256M")
	a, b := gateway(t, conf, img, 1), gateway(t, conf, img, 2)
	go func() {
		time.Sleep(3 * time.Second)
		a.cmd.Process.Signal(syscall.SIGKILL)
	}()
	out, code := blockwire(t, "bench", "--rw", "randwrite", "--bs", "4k", "--qd", "16", "--size", "64MiB", "--time", "10s",
		"--verify", "--overwrite", "--path", b.addr, a.url(defaultIQN, 0))
	if code != 0 || !strings.Contains(out, "verify: 0 mismatches") {
		t.Fatalf("bench --verify through a gateway that died (exit %d):\n%s", code, out)
	}
	if !strings.Contains(out, "failed over to another path") {
		t.Fatalf("no failover seen:\n%s", out)
	}
	if !strings.Contains(b.log.String(), "login complete") {
		t.Fatal("gateway B never saw the initiator")
	}
	t.Logf("through a gateway killed after 3 s, with B as the second path:\n%s", out)
}
