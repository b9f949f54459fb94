package interop

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
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
	long(t)
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
	if code != 4 || !strings.Contains(out, "unable to associate RDMA channel with I_T nexus") || !strings.Contains(out, "is not this target's") {
		t.Fatalf("login to a wrong target port: exit %d\n%s", code, out)
	}
	if strings.Contains(d.log.String(), "level=ERROR") {
		t.Errorf("target logged errors:\n%s", d.log.String())
	}
}

// TestSRPHonoursTheTargetACL: a target whose ACL refuses an initiator
// over iSCSI does not hand its data to an SRP initiator either (once
// `blockwire read srp://…` read a target that refused iscsi-inq). Serving
// a protected target over SRP needs srp_initiators; only the ports listed
// get in; changing them by reload takes effect for the next login.
func TestSRPHonoursTheTargetACL(t *testing.T) {
	long(t)
	need(t, "iscsi-inq")
	dir := t.TempDir()
	srpAddr := freePort(t)
	conf := func(srpInitiators string) string {
		p := filepath.Join(dir, "c.toml")
		os.WriteFile(p, []byte(`
srp_listen = ["`+srpAddr+`"]
srp_id_ext = "0011223344556677:8899aabbccddeeff"
[[target]]
name = "iqn.2026-11.org.blockwire:guarded"
initiators = ["iqn.2026-11.org.example:allowed"]
`+srpInitiators+`
[[target.lun]]
id = 0
size = "8MiB"
[[target.lun]]
id = 1
size = "16MiB"
`), 0o600)
		return p
	}
	out, code := blockwire(t, "serve", "--listen", freePort(t), "--config", conf(""))
	if code == 0 || !strings.Contains(out, "srp_initiators") {
		t.Fatalf("a protected target served over SRP without srp_initiators: exit %d\n%s", code, out)
	}
	const listed = "0000000000000001:0002c90300b10c6b"
	const stranger = "0000000000000002:0002c90300b10c6b"
	d := serve(t, "--config", conf(`srp_initiators = ["`+listed+`"]`))
	base := "srp://" + srpAddr + "/0011223344556677:8899aabbccddeeff/0"
	if out, _ := run(t, 30*time.Second, "iscsi-inq", "-i", "iqn.2026-11.org.example:stranger", d.url("iqn.2026-11.org.blockwire:guarded", 0)); !strings.Contains(out, "Authorization failure") {
		t.Fatalf("iSCSI stranger: %s", out)
	}
	for _, c := range []struct {
		initiator string
		code      int
	}{{stranger, 4}, {"", 4}, {listed, 0}} {
		u := base
		if c.initiator != "" {
			u += "?initiator=" + c.initiator
		}
		out, code := blockwire(t, "read", "--length", "4096", "--out", "/dev/null", u)
		if code != c.code {
			t.Errorf("SRP read as %q: exit %d, want %d\n%s", c.initiator, code, c.code, out)
		}
		if c.code == 4 && !strings.Contains(out, "unable to associate RDMA channel with I_T nexus") {
			t.Errorf("SRP refusal without its reason:\n%s", out)
		}
	}
	// Reload with the stranger listed instead, through an ACL entry that
	// shows it only LUN 1, as its LUN 0: the next logins follow.
	conf(`[[target.acl]]
srp_initiator = "` + stranger + `"
luns = ["0=1"]`)
	d.cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(500 * time.Millisecond)
	if out, code := blockwire(t, "read", "--length", "4096", "--out", "/dev/null", base+"?initiator="+listed); code != 4 {
		t.Fatalf("after reload, the port no longer listed: exit %d\n%s", code, out)
	}
	if out, code := blockwire(t, "inquiry", base+"?initiator="+stranger); code != 0 || !strings.Contains(out, "capacity: 16777216 bytes") {
		t.Fatalf("after reload, the port now listed sees LUN 1 as its LUN 0: exit %d\n%s", code, out)
	}
	if out, code := blockwire(t, "inquiry", strings.TrimSuffix(base, "/0")+"/1?initiator="+stranger); code == 0 {
		t.Fatalf("the port reached a LUN it does not map:\n%s", out)
	}
}
