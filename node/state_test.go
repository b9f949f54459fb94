package node_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/node"
	"github.com/blockwire/blockwire/node/nodetest"
)

const stateTarget = "iqn.2026-11.org.example:state"

// stateNode serves file (written first) with its state in the same
// directory, as serve --config does.
func stateNode(t *testing.T, file, text string) *node.Node {
	t.Helper()
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen = []string{"127.0.0.1:0"}
	return nodetest.Start(t, cfg, node.Options{ConfigFile: file, StateFile: node.DefaultStateFile(file)})
}

func lunSize(n *node.Node, lun uint64) int64 {
	for _, d := range n.Devices() {
		if d.Name() == stateTarget {
			if lu := d.LU(lun); lu != nil {
				return int64(lu.Blocks()) * int64(lu.BlockSize())
			}
		}
	}
	return -1
}

// TestStateMerge: a reload applies only what the file changed since it was
// last applied; what was changed live stays unless the file changes the
// same thing (then it is a conflict, refused unless forced); the live
// changes outlast a restart of the node (the state file), and a
// conflicting file at start is refused with the reason.
func TestStateMerge(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bw.toml")
	v1 := "[[target]]\nname = \"" + stateTarget + "\"\n[[target.lun]]\nid = 0\nsize = \"8MiB\"\n"
	n := stateNode(t, file, v1)
	ctl := n.Admin()
	if err := ctl.ResizeLU(stateTarget, 0, 16<<20, false); err != nil {
		t.Fatal(err)
	}
	if err := ctl.AddLU(admin.NewLU{Target: stateTarget, LUN: 1, Size: "4MiB"}); err != nil {
		t.Fatal(err)
	}
	// The file adds LUN 2: applied, and the live changes stay.
	v2 := v1 + "[[target.lun]]\nid = 2\nsize = \"2MiB\"\n"
	os.WriteFile(file, []byte(v2), 0o600)
	ch, err := n.Reload(node.ReloadOptions{DryRun: true})
	if err != nil || len(ch.Applied) != 1 || !strings.Contains(ch.Applied[0], "LUN 2: add") {
		t.Fatalf("dry run: %+v %v, want LUN 2 added alone", ch, err)
	}
	if lunSize(n, 2) != -1 {
		t.Fatal("a dry run added the LUN")
	}
	if _, err := n.Reload(node.ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	if lunSize(n, 0) != 16<<20 || lunSize(n, 1) != 4<<20 || lunSize(n, 2) != 2<<20 {
		t.Fatalf("after the reload: LUN sizes %d %d %d", lunSize(n, 0), lunSize(n, 1), lunSize(n, 2))
	}
	// The file resizes LUN 0 too, differently: a conflict.
	v3 := strings.Replace(v2, `size = "8MiB"`, `size = "32MiB"`, 1)
	os.WriteFile(file, []byte(v3), 0o600)
	_, err = n.Reload(node.ReloadOptions{})
	var refused *node.Refused
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "LUN 0") || !strings.Contains(err.Error(), "--force") || lunSize(n, 0) != 16<<20 {
		t.Fatalf("a conflicting reload: %v, LUN 0 %d bytes", err, lunSize(n, 0))
	}
	if !errors.Is(err, admin.ErrRefused) {
		t.Errorf("a refusal is not admin.ErrRefused to the API: %v", err)
	}
	// A setting only a restart applies: reloaded, it waits, and the
	// next start serves it.
	v2 = "[limits]\ncmd_window = 64\n" + v2
	os.WriteFile(file, []byte(v2), 0o600)
	if ch, err := n.Reload(node.ReloadOptions{}); err != nil || len(ch.Restart) != 1 || n.Config().Limits.CmdWindow == 64 {
		t.Fatalf("a reload of a limit: %+v %v, cmd_window %d", ch, err, n.Config().Limits.CmdWindow)
	}

	// A restart of the node (the same files) serves what ran, and what
	// waited for it.
	ctxShutdown(t, n)
	n = stateNode(t, file, v2)
	if lunSize(n, 0) != 16<<20 || lunSize(n, 1) != 4<<20 || lunSize(n, 2) != 2<<20 {
		t.Fatalf("after a restart: LUN sizes %d %d %d", lunSize(n, 0), lunSize(n, 1), lunSize(n, 2))
	}
	if n.Config().Limits.CmdWindow != 64 {
		t.Errorf("after a restart: cmd_window %d, want the file's 64", n.Config().Limits.CmdWindow)
	}
	ctxShutdown(t, n)
	// A file that conflicts with the recorded changes is refused at
	// start, naming the LUN and the state file.
	os.WriteFile(file, []byte(v3), 0o600)
	cfg, _ := config.Load(file)
	_, err = node.New(cfg, node.Options{ConfigFile: file, StateFile: node.DefaultStateFile(file)})
	if err == nil || !strings.Contains(err.Error(), "LUN 0") || !strings.Contains(err.Error(), "state") {
		t.Fatalf("start with a conflicting file: %v", err)
	}
}

// TestChangesRefusedWithoutConsent: a change that would lose data — an
// in-memory LUN made smaller or replaced — is refused whole, with the LUN,
// the reason and the flag, and changes nothing; with the consent it is
// made.
func TestChangesRefusedWithoutConsent(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bw.toml")
	v1 := "[[target]]\nname = \"" + stateTarget + "\"\n[[target.lun]]\nid = 0\nsize = \"8MiB\"\n[[target.lun]]\nid = 1\nsize = \"8MiB\"\n"
	n := stateNode(t, file, v1)
	smaller := strings.Replace(v1, `size = "8MiB"`, `size = "4MiB"`, 1) // LUN 0
	replaced := strings.Replace(v1, "id = 1\nsize = \"8MiB\"", "id = 1\nsize = \"8MiB\"\nserial = \"other\"", 1)
	for _, c := range []struct {
		file, says string
		consent    node.Consent
	}{
		{smaller, "--shrink", node.Consent{Shrink: true}},
		{replaced, "--force", node.Consent{Force: true}},
	} {
		os.WriteFile(file, []byte(c.file), 0o600)
		_, err := n.Reload(node.ReloadOptions{})
		if err == nil || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "nothing changed") {
			t.Errorf("reload without consent: %v, want a refusal naming %s", err, c.says)
		}
		if lunSize(n, 0) != 8<<20 || lunSize(n, 1) != 8<<20 {
			t.Errorf("a refused reload changed the LUNs: %d %d", lunSize(n, 0), lunSize(n, 1))
		}
		if _, err := n.Reload(node.ReloadOptions{Consent: c.consent}); err != nil {
			t.Errorf("reload with %+v: %v", c.consent, err)
		}
		os.WriteFile(file, []byte(v1), 0o600)
		if _, err := n.Reload(node.ReloadOptions{Consent: node.Consent{Shrink: true, Force: true}}); err != nil {
			t.Fatal(err)
		}
	}
	if lunSize(n, 0) != 8<<20 {
		t.Errorf("LUN 0 back at %d bytes", lunSize(n, 0))
	}
}

func ctxShutdown(t *testing.T, n *node.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReloadRefusesWhatIsInUse: a reload whose file drops a LUN an
// initiator is logged in to, or the whole target, is refused with the
// reason and --force, and changes nothing; the initiator keeps reading.
// With Force the LUN goes.
func TestReloadRefusesWhatIsInUse(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bw.toml")
	v1 := "[[target]]\nname = \"" + stateTarget + "\"\n[[target.lun]]\nid = 0\nsize = \"8MiB\"\n[[target.lun]]\nid = 1\nsize = \"8MiB\"\n"
	n := stateNode(t, file, v1)
	ctx := context.Background()
	dev, err := initiator.Open(ctx, "iscsi://"+nodetest.Portal(t, n, "iscsi")+"/"+stateTarget+"/1", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	buf := make([]byte, 4096)
	for _, text := range []string{
		strings.Replace(v1, "[[target.lun]]\nid = 1\nsize = \"8MiB\"\n", "", 1),                           // LUN 1 gone
		"[[target]]\nname = \"iqn.2026-11.org.example:other\"\n[[target.lun]]\nid = 0\nsize = \"1MiB\"\n", // the target gone
	} {
		os.WriteFile(file, []byte(text), 0o600)
		_, err := n.Reload(node.ReloadOptions{})
		if err == nil || !strings.Contains(err.Error(), "session") || !strings.Contains(err.Error(), "--force") {
			t.Errorf("a reload dropping what is in use: %v", err)
		}
		if lunSize(n, 1) != 8<<20 {
			t.Fatal("a refused reload removed LUN 1")
		}
		if _, err := dev.ReadAtContext(ctx, buf, 0); err != nil {
			t.Fatalf("the initiator after a refused reload: %v", err)
		}
	}
	os.WriteFile(file, []byte(strings.Replace(v1, "[[target.lun]]\nid = 1\nsize = \"8MiB\"\n", "", 1)), 0o600)
	if _, err := n.Reload(node.ReloadOptions{Consent: node.Consent{Force: true}}); err != nil || lunSize(n, 1) != -1 {
		t.Fatalf("a forced reload: %v, LUN 1 %d bytes", err, lunSize(n, 1))
	}
}

// TestAccessVerbs: the ACL and CHAP verbs refuse what makes no sense —
// a second entry for one initiator, unmapping the last LUN an entry sees
// (which would show it every LUN), an ACL entry's CHAP before the entry,
// mutual CHAP without CHAP — and change nothing then; a plain-list name
// becomes an entry of its own when given a LUN map.
func TestAccessVerbs(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bw.toml")
	const host = "iqn.2026-11.org.example:h"
	n := stateNode(t, file, "[[target]]\nname = \""+stateTarget+"\"\ninitiators = [\""+host+"\"]\n"+
		"[[target.lun]]\nid = 0\nsize = \"1MiB\"\n[[target.lun]]\nid = 1\nsize = \"1MiB\"\n")
	ctl := n.Admin()
	one := uint64(1)
	if err := ctl.ChangeACL(admin.ACLChange{Target: stateTarget, Initiator: host, Map: []string{"1"}}); err != nil {
		t.Fatal(err)
	}
	tc := n.Config().Targets[0]
	if len(tc.Initiators) != 0 || len(tc.ACL) != 1 || tc.ACL[0].Initiator != host || len(tc.ACL[0].LUNs) != 1 {
		t.Fatalf("a listed name given a LUN map: %+v", tc)
	}
	for _, c := range []struct {
		what string
		err  error
	}{
		{"a second entry", ctl.ChangeACL(admin.ACLChange{Target: stateTarget, Initiator: host, Add: true})},
		{"unmapping the last LUN", ctl.ChangeACL(admin.ACLChange{Target: stateTarget, Initiator: host, Unmap: &one})},
		{"a LUN the target lacks", ctl.ChangeACL(admin.ACLChange{Target: stateTarget, Initiator: host, Map: []string{"9"}})},
		{"CHAP of a missing entry", ctl.SetCHAP(admin.CHAPChange{Target: stateTarget, Initiator: "iqn.2026-11.org.example:x", User: "u", Secret: "0123456789abcdef"})},
		{"mutual CHAP alone", ctl.SetCHAP(admin.CHAPChange{Target: stateTarget, Mutual: true, User: "u", Secret: "0123456789abcdef"})},
		{"a short secret", ctl.SetCHAP(admin.CHAPChange{Target: stateTarget, User: "u", Secret: "short"})},
	} {
		if c.err == nil {
			t.Errorf("%s: accepted", c.what)
		}
	}
	if after := n.Config().Targets[0]; !reflect.DeepEqual(after, tc) {
		t.Errorf("refused verbs changed the target:\n%+v\nwas\n%+v", after, tc)
	}
}

// TestReloadRefusesAnotherImage: a file LUN the file points at another
// image is refused without Force (its initiators would see other data),
// and the image it serves stays locked by this node alone.
func TestReloadRefusesAnotherImage(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "bw.toml")
	v1 := "[[target]]\nname = \"" + stateTarget + "\"\n[[target.lun]]\nid = 0\nfile = \"a.img\"\nsize = \"1MiB\"\n"
	n := stateNode(t, file, v1)
	os.WriteFile(file, []byte(strings.Replace(v1, "a.img", "b.img", 1)), 0o600)
	_, err := n.Reload(node.ReloadOptions{})
	if err == nil || !strings.Contains(err.Error(), "b.img instead of") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("a reload pointing LUN 0 at another image: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b.img")); err == nil {
		t.Error("a refused reload created the other image")
	}
	if _, err := n.Reload(node.ReloadOptions{Consent: node.Consent{Force: true}}); err != nil {
		t.Fatalf("forced: %v", err)
	}
	if tr := n.Admin().Tree(); tr.Targets[0].LUNs[0].Backing != filepath.Join(dir, "b.img") {
		t.Errorf("after the forced reload LUN 0 is %s", tr.Targets[0].LUNs[0].Backing)
	}
}
