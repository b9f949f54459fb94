package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/auth"
	"github.com/blockwire/blockwire/iscsi/initiator"
)

// TestOperatorSession: a scripted session, as an operator coming
// from targetcli would run it. A hand-written configuration (comments, a
// relative --config, a relative secret file) is served; LUNs are resized
// and added, a target added and an ACL set with admin verbs; a reload of
// the unchanged file changes nothing (its dry run says so) and never
// truncates the file resized live; a restart serves what ran before; the
// hand-written file is never rewritten. Reloads and verbs that would lose
// data or cut initiators off are refused with the LUN, the reason and the
// flag, and change nothing; admin save writes files that load.
func TestOperatorSession(t *testing.T) {
	long(t)
	const (
		tgt  = "iqn.2026-11.org.example:db"
		tgt2 = "iqn.2026-11.org.example:scratch"
		host = "iqn.2026-11.org.example:host1"
	)
	work := t.TempDir()
	os.Mkdir(filepath.Join(work, "cfg"), 0o700)
	os.Mkdir(filepath.Join(work, "images"), 0o700)
	img := filepath.Join(work, "images", "db.img")
	os.WriteFile(filepath.Join(work, "cfg", "host1.secret"), []byte("host1-secret-0123\n"), 0o600)
	hand := `# the database target — hand-written, with comments
[[target]]
name = "` + tgt + `"

  # host1 only, with CHAP
  [[target.acl]]
  initiator = "` + host + `"
  [target.acl.chap]
  user = "host1"
  secret_file = "host1.secret"   # beside this file

  [[target.lun]]
  id = 0
  file = "` + img + `"
  size = "48MiB"
`
	cfgFile := filepath.Join(work, "cfg", "bw.toml")
	writeCfg := func(s string) {
		t.Helper()
		if err := os.WriteFile(cfgFile, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(hand)
	sock := filepath.Join(work, "admin.sock")
	args := []string{"--config", "cfg/bw.toml", "--admin-socket", sock, "--admin-dir", work}
	d := serveIn(t, work, args...)
	adm := func(want int, a ...string) string {
		t.Helper()
		out, code := blockwire(t, append([]string{"admin", "--socket", sock}, a...)...)
		if code != want {
			t.Fatalf("admin %v: exit %d, want %d:\n%s", a, code, want, out)
		}
		return out
	}
	fileSize := func() int64 {
		st, err := os.Stat(img)
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	luns := func() map[string]int64 {
		t.Helper()
		var ls []admin.LUN
		if err := json.Unmarshal([]byte(adm(0, "--json", "luns")), &ls); err != nil {
			t.Fatal(err)
		}
		m := map[string]int64{}
		for _, l := range ls {
			m[fmt.Sprintf("%s/%d", l.Target, l.LUN)] = l.Size
		}
		return m
	}
	url := func(d *daemon, lun int) string {
		return fmt.Sprintf("iscsi://host1%%host1-secret-0123@%s/%s/%d", d.addr, tgt, lun)
	}

	// Live changes: a resize with data past the old end, a LUN, a target.
	adm(0, "resize", tgt, "0", "64MiB")
	marker := filepath.Join(work, "marker")
	os.WriteFile(marker, []byte(strings.Repeat("M", 4096)), 0o600)
	if out, code := blockwire(t, "write", "--initiator-name", host, "--overwrite", "--offset", "60MiB", "--in", marker, url(d, 0)); code != 0 {
		t.Fatalf("write at 60 MiB (exit %d):\n%s", code, out)
	}
	adm(0, "add-lun", tgt, "1", "--size", "16MiB")
	adm(0, "add-target", tgt2, "--size", "8MiB")
	adm(0, "set-initiators", tgt2, host)
	// targetcli's everyday access edits, as verbs: an ACL entry with
	// its networks, its LUN map and its own CHAP (the secret on stdin).
	const host2 = "iqn.2026-11.org.example:host2"
	adm(0, "add-lun", tgt2, "1", "--size", "4MiB")
	adm(0, "acl-add", tgt2, host2, "--from", "127.0.0.0/8", "--luns", "0")
	adm(0, "map-lun", tgt2, host2, "5=1")
	adm(0, "unmap-lun", tgt2, host2, "0")
	chap := exec.Command(binary, "admin", "--socket", sock, "chap", tgt2, host2, "--user", "host2", "--secret-stdin")
	chap.Env = clientEnv()
	chap.Stdin = strings.NewReader("host2-secret-4567\n")
	if out, err := chap.CombinedOutput(); err != nil {
		t.Fatalf("admin chap --secret-stdin: %v\n%s", err, out)
	}
	host2Sees := func(what string) {
		t.Helper()
		u := func(lun int) string {
			return fmt.Sprintf("iscsi://host2%%host2-secret-4567@%s/%s/%d", d.addr, tgt2, lun)
		}
		if out, code := blockwire(t, "inquiry", "--initiator-name", host2, u(5)); code != 0 || !strings.Contains(out, "4194304 bytes") {
			t.Errorf("%s: host2 on its LUN 5 (target LUN 1): exit %d\n%s", what, code, out)
		}
		if out, code := blockwire(t, "inquiry", "--initiator-name", host2, u(0)); code == 0 {
			t.Errorf("%s: host2 reached LUN 0, unmapped:\n%s", what, out)
		}
		if out, code := blockwire(t, "inquiry", "--initiator-name", host2, fmt.Sprintf("iscsi://%s/%s/5", d.addr, tgt2)); code == 0 {
			t.Errorf("%s: host2 logged in without its CHAP secret:\n%s", what, out)
		}
	}
	host2Sees("after the verbs")
	tree := func() string {
		t.Helper()
		var tr admin.Tree
		if err := json.Unmarshal([]byte(adm(0, "--json", "ls")), &tr); err != nil {
			t.Fatal(err)
		}
		for i := range tr.Targets {
			tr.Targets[i].Sessions = nil
		}
		tr.Portals = nil
		b, _ := json.Marshal(tr)
		return string(b)
	}
	ls := adm(0, "ls")
	for _, w := range []string{"target " + tgt2, "acl " + host2, "from: 127.0.0.0/8", "sees LUNs: 5=1", "chap: user host2", "lun 0: " + img + ", 64MiB", "lun 1: memory, 4MiB"} {
		if !strings.Contains(ls, w) {
			t.Errorf("admin ls lacks %q:\n%s", w, ls)
		}
	}
	treeBefore := tree()
	want := map[string]int64{tgt + "/0": 64 << 20, tgt + "/1": 16 << 20, tgt2 + "/0": 8 << 20, tgt2 + "/1": 4 << 20}
	checkState := func(what string) {
		t.Helper()
		got := luns()
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s is %d bytes, want %d (all: %v)", what, k, got[k], v, got)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: LUNs %v, want %v", what, got, want)
		}
		if fileSize() != 64<<20 {
			t.Errorf("%s: the image holds %d bytes, want 64 MiB", what, fileSize())
		}
		back := filepath.Join(work, "back")
		os.Remove(back)
		if out, code := blockwire(t, "read", "--initiator-name", host, "--offset", "60MiB", "--length", "4096", "--out", back, url(d, 0)); code != 0 {
			t.Errorf("%s: read of the marker (exit %d):\n%s", what, code, out)
		} else if b, _ := os.ReadFile(back); string(b) != strings.Repeat("M", 4096) {
			t.Errorf("%s: the marker at 60 MiB is gone", what)
		}
		if b, _ := os.ReadFile(cfgFile); string(b) != hand {
			t.Errorf("%s: the hand-written file changed:\n%s", what, b)
		}
	}
	checkState("after the live changes")

	// A reload of the unchanged file changes nothing; its dry run says so.
	if out := adm(0, "reload", "--dry-run"); !strings.Contains(out, "no changes") {
		t.Errorf("reload --dry-run of the unchanged file:\n%s", out)
	}
	var rr admin.ReloadResult
	if err := json.Unmarshal([]byte(adm(0, "reload")), &rr); err != nil || len(rr.Changes) != 0 {
		t.Errorf("reload of the unchanged file: %+v %v, want no changes", rr, err)
	}
	checkState("after a reload of the unchanged file")

	// A restart serves what ran before.
	if err := d.stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	d = serveIn(t, work, args...)
	checkState("after a restart")
	host2Sees("after a restart")
	if after := tree(); after != treeBefore {
		t.Errorf("admin ls after the restart:\n%s\nbefore:\n%s", after, treeBefore)
	}
	if st, err := os.Stat(filepath.Join(work, "cfg", "bw.state.toml")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the node's state: %v, mode %v (it holds a CHAP secret: want 0600)", err, st.Mode())
	}
	if out := adm(0, "reload", "--dry-run"); !strings.Contains(out, "no changes") {
		t.Errorf("reload --dry-run after the restart:\n%s", out)
	}

	// Refusals: each names the LUN, the reason and the flag; nothing changes.
	writeCfg(strings.Replace(hand, `size = "48MiB"`, `size = "32MiB"`, 1))
	out := adm(0, "reload", "--dry-run")
	if !strings.Contains(out, "refused") || !strings.Contains(out, "LUN 0") || !strings.Contains(out, "truncate") {
		t.Errorf("dry run of a file that shrinks a file LUN:\n%s", out)
	}
	for _, flags := range [][]string{nil, {"--shrink"}} {
		out = adm(1, append([]string{"reload"}, flags...)...)
		if !strings.Contains(out, "LUN 0") || !strings.Contains(out, "truncate") || !strings.Contains(out, "admin resize --shrink") {
			t.Errorf("reload %v shrinking a file LUN:\n%s", flags, out)
		}
	}
	writeCfg(hand)
	checkState("after refused reloads")

	ctx := context.Background()
	dev, err := initiator.Open(ctx, url(d, 1), initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: host,
		CHAP: &auth.Credentials{User: "host1", Secret: "host1-secret-0123"}})
	if err != nil {
		t.Fatal(err)
	}
	out = adm(1, "remove-lun", tgt, "1")
	if !strings.Contains(out, "LUN 1") || !strings.Contains(out, "session") || !strings.Contains(out, "--force") {
		t.Errorf("remove-lun of a LUN in use:\n%s", out)
	}
	// The file drops the target that was changed live: a conflict,
	// refused until the operator says which side wins.
	writeCfg("[[target]]\nname = \"iqn.2026-11.org.example:other\"\n[[target.lun]]\nid = 0\nsize = \"1MiB\"\n")
	out = adm(1, "reload")
	if !strings.Contains(out, tgt) || !strings.Contains(out, "changed live") || !strings.Contains(out, "--force") {
		t.Errorf("reload removing a target changed live:\n%s", out)
	}
	writeCfg(hand)
	checkState("after refused removals")
	dev.Close()
	adm(0, "remove-lun", tgt, "1")
	delete(want, tgt+"/1")
	checkState("after remove-lun")

	// admin save writes files that load: relative secrets stay right.
	other := filepath.Join(work, "other.toml")
	adm(0, "save", other)
	if _, err := config.Load(other); err != nil {
		t.Errorf("admin save %s wrote a file that does not load: %v", other, err)
	}
	if out, code := blockwire(t, "config", "check", other); code != 0 {
		t.Errorf("config check of the saved file (exit %d):\n%s", code, out)
	}
	if b, _ := os.ReadFile(other); !strings.Contains(string(b), `size = "64MiB"`) || strings.Contains(string(b), "roce_udp_port") || !strings.Contains(string(b), `secret_file = "cfg/host1.secret"`) {
		t.Errorf("the saved file: sizes as written, no unset keys, secret files relative to it:\n%s", b)
	}
	adm(0, "save")
	if _, err := config.Load(cfgFile); err != nil {
		t.Errorf("admin save over the configuration wrote a file that does not load: %v", err)
	}
	if out := adm(0, "reload", "--dry-run"); !strings.Contains(out, "no changes") {
		t.Errorf("reload --dry-run after save:\n%s", out)
	}
	if err := d.stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	hand, _ = func() (string, error) { b, err := os.ReadFile(cfgFile); return string(b), err }()
	d = serveIn(t, work, args...)
	checkState("after save and a restart")
}

// TestLibiscsiWithUnaskedCHAP: libiscsi holding CHAP credentials logs in
// to a target that asks for none — it declares InitiatorName again in its
// operational-stage PDU, which blockwire tolerates (identical identity
// keys only) and logs once; a discovery listing and a LUN listing work.
func TestLibiscsiWithUnaskedCHAP(t *testing.T) {
	long(t)
	need(t, "iscsi-ls")
	const ini = "iqn.2026-11.org.example:libiscsi-chap"
	d := serve(t, "--size", "8MiB")
	out := mustRun(t, time.Minute, "iscsi-ls", "-s", "-i", ini, "iscsi://user%secret0123456@"+d.addr)
	if !strings.Contains(out, defaultIQN) || !strings.Contains(out, "Lun:0") {
		t.Fatalf("iscsi-ls -s with unasked CHAP credentials:\n%s\n%s", out, d.log)
	}
	if !strings.Contains(d.log.String(), "declared these again with the same value") {
		t.Errorf("the quirk is not logged:\n%s", d.log)
	}
}
