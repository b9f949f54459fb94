package main

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/node"
	"github.com/blockwire/blockwire/node/nodetest"
	"github.com/blockwire/blockwire/nvme/dhchap"
)

// TestNVMeClientVerbs: the client verbs on an nvme+tcp:// URL as an
// operator types them — discover, inquiry, write, read, copy, bench
// with --verify — against a node serving NVMe/TCP; a second node serves
// that namespace again as a gateway (remote = nvme+tcp://) over iSCSI.
func TestNVMeClientVerbs(t *testing.T) {
	const iqn = "iqn.2026-11.org.example:nv"
	cfg := &config.Config{NVMeListen: []string{"127.0.0.1:0"},
		Targets: []config.Target{{Name: iqn, LUNs: []config.LUN{{ID: 0, Size: "4MiB"}}}}}
	n := nodetest.Start(t, cfg, node.Options{})
	addr := nodetest.Portal(t, n, config.NVMeTCP)
	nqn := config.NQNPrefix + iqn
	url := "nvme+tcp://" + addr + "/" + nqn + "/1"
	cli := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	if code, out := cli("discover", "nvme+tcp://"+addr); code != 0 || !strings.Contains(out, addr+" "+nqn) {
		t.Fatalf("discover: exit %d\n%s", code, out)
	}
	if code, out := cli("inquiry", url); code != 0 || !strings.Contains(out, "NVMe") || !strings.Contains(out, "4194304") {
		t.Fatalf("inquiry: exit %d\n%s", code, out)
	}
	if code, out := cli("inquiry", "nvme+tcp://"+addr+"/"+nqn); code != exitUsage || !strings.Contains(out, "names no namespace") {
		t.Fatalf("inquiry of a URL without a namespace: exit %d\n%s", code, out)
	}
	dir := t.TempDir()
	img := make([]byte, 4<<20)
	rand.Read(img)
	in, back := filepath.Join(dir, "in"), filepath.Join(dir, "back")
	os.WriteFile(in, img, 0o600)
	if code, out := cli("write", "--overwrite", "--in", in, url); code != 0 {
		t.Fatalf("write: exit %d\n%s", code, out)
	}
	if code, out := cli("read", url, "--out", back); code != 0 {
		t.Fatalf("read: exit %d\n%s", code, out)
	}
	if b, _ := os.ReadFile(back); !bytes.Equal(b, img) {
		t.Fatal("read back differs from what write wrote")
	}
	if code, out := cli("bench", "--overwrite", "--verify", "--rw", "randwrite", "--qd", "8", "--time", "300ms", "--size", "1MiB", url); code != 0 || !strings.Contains(out, "verify: 0 mismatches") {
		t.Fatalf("bench --verify: exit %d\n%s", code, out)
	}

	// A gateway: iSCSI in front of the NVMe namespace.
	const gw = "iqn.2026-11.org.example:gw"
	iser := false
	g := nodetest.Start(t, &config.Config{Listen: []string{"127.0.0.1:0"}, ISER: &iser,
		Targets: []config.Target{{Name: gw, LUNs: []config.LUN{{ID: 0, Remote: url}}}}}, node.Options{})
	gurl := "iscsi://" + nodetest.Portal(t, g, config.ISCSI) + "/" + gw + "/0"
	os.Remove(back)
	if code, out := cli("copy", "--force", url, back); code != 0 {
		t.Fatalf("copy from NVMe: exit %d\n%s", code, out)
	}
	front := filepath.Join(dir, "front")
	if code, out := cli("read", gurl, "--out", front); code != 0 {
		t.Fatalf("read through the gateway: exit %d\n%s", code, out)
	}
	a, _ := os.ReadFile(back)
	b, _ := os.ReadFile(front)
	if len(a) != 4<<20 || !bytes.Equal(a, b) {
		t.Fatalf("the gateway's LUN (%d bytes) and the namespace (%d bytes) differ", len(b), len(a))
	}
}

// TestNVMeClientDHCHAP: the client verbs authenticate an NVMe host with
// --dhchap-secret-file (and the controller with --dhchap-ctrl-secret-file),
// are refused without the secret or with another, and refuse iSCSI's CHAP
// flags on an nvme+tcp:// URL with a message naming the right ones.
func TestNVMeClientDHCHAP(t *testing.T) {
	const iqn = "iqn.2026-11.org.example:auth"
	const host = "nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-4000-8000-000000000000"
	hk, ck, other := dhchap.NewSecret(32, dhchap.SHA256), dhchap.NewSecret(32, 0), dhchap.NewSecret(32, dhchap.SHA256)
	cfg := &config.Config{NVMeListen: []string{"127.0.0.1:0"},
		Targets: []config.Target{{Name: iqn, LUNs: []config.LUN{{ID: 0, Size: "4MiB"}},
			ACL: []config.ACL{{Host: host, DHCHAP: &config.Secret{Secret: hk.String()}, DHCHAPCtrl: &config.Secret{Secret: ck.String()}}}}}}
	n := nodetest.Start(t, cfg, node.Options{})
	url := "nvme+tcp://" + nodetest.Portal(t, n, config.NVMeTCP) + "/" + config.NQNPrefix + iqn + "/1"
	dir := t.TempDir()
	file := func(name, v string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(v+"\n"), 0o600)
		return p
	}
	hf, cf, of := file("host", hk.String()), file("ctrl", ck.String()), file("other", other.String())
	cli := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	if code, out := cli("inquiry", "--initiator-name", host, "--dhchap-secret-file", hf, "--dhchap-ctrl-secret-file", cf, url); code != 0 || !strings.Contains(out, "NVMe") {
		t.Fatalf("inquiry with both secrets: exit %d\n%s", code, out)
	}
	if code, out := cli("inquiry", "--initiator-name", host, "--dhchap-secret-file", hf, url); code != 0 {
		t.Fatalf("inquiry with the host's secret: exit %d\n%s", code, out)
	}
	for name, args := range map[string][]string{
		"no secret":            {},
		"another secret":       {"--dhchap-secret-file", of},
		"another controller's": {"--dhchap-secret-file", hf, "--dhchap-ctrl-secret-file", of},
	} {
		if code, out := cli(append(append([]string{"inquiry", "--initiator-name", host}, args...), url)...); code == 0 {
			t.Fatalf("%s: inquiry got in\n%s", name, out)
		}
	}
	if code, out := cli("inquiry", "--initiator-name", host, "--chap-secret-file", hf, url); code == 0 || !strings.Contains(out, "--dhchap-secret-file") {
		t.Fatalf("iSCSI's --chap-secret-file on an NVMe URL: exit %d\n%s", code, out)
	}
	if code, out := cli("inquiry", "--initiator-name", host, "--dhchap-ctrl-secret-file", cf, url); code == 0 || !strings.Contains(out, "needs --dhchap-secret-file") {
		t.Fatalf("a controller secret alone: exit %d\n%s", code, out)
	}
}
