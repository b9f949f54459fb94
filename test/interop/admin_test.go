package interop

import (
	"context"
	be "encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
)

// TestAdminAtRuntime: a LUN added and a LUN resized through the
// administration socket are seen by an initiator that stays connected —
// first as the unit attentions SPC-4 requires (REPORTED LUNS DATA HAS
// CHANGED, CAPACITY DATA HAS CHANGED), then in REPORT LUNS and READ
// CAPACITY; the session is listed with its connection and dropped on
// request, after which the initiator reconnects by itself.
func TestAdminAtRuntime(t *testing.T) {
	long(t)
	sock := filepath.Join(t.TempDir(), "admin.sock")
	apiDir := t.TempDir()
	d := serve(t, "--size", "64MiB", "--admin-socket", sock, "--admin-dir", apiDir)
	adm := func(args ...string) string {
		t.Helper()
		out, code := blockwire(t, append([]string{"admin", "--socket", sock}, args...)...)
		if code != 0 {
			t.Fatalf("admin %v (exit %d):\n%s", args, code, out)
		}
		return out
	}
	ctx := context.Background()
	dev, err := initiator.Open(ctx, d.url(defaultIQN, 0), initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	s := dev.Session()
	do := func(lun uint64, cdb []byte, in []byte) error {
		_, err := s.Do(ctx, lun, cdb, nil, in)
		return err
	}
	senseIs := func(err error, asc, ascq byte) bool {
		var se *initiator.SCSIError
		return errors.As(err, &se) && se.Sense != nil && se.Sense.ASC == asc && se.Sense.ASCQ == ascq
	}
	reportLUNs := []byte{0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}
	buf := make([]byte, 256)
	do(0, reportLUNs, buf) // clears the power-on unit attention
	if err := do(0, reportLUNs, buf); err != nil || be.BigEndian.Uint32(buf) != 8 {
		t.Fatalf("REPORT LUNS before: %v, list length %d", err, be.BigEndian.Uint32(buf))
	}

	adm("add-lun", defaultIQN, "1", "--size", "16MiB")
	if err := do(0, []byte{0, 0, 0, 0, 0, 0}, nil); !senseIs(err, 0x3f, 0x0e) {
		t.Fatalf("after add-lun: %v, want REPORTED LUNS DATA HAS CHANGED", err)
	}
	if err := do(0, reportLUNs, buf); err != nil || be.BigEndian.Uint32(buf) != 16 || buf[8+8+1] != 1 {
		t.Fatalf("REPORT LUNS after add-lun: %v % x", err, buf[:24])
	}

	adm("resize", defaultIQN, "0", "128MiB")
	readCap16 := []byte{0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0}
	if err := do(0, readCap16, buf[:32]); !senseIs(err, 0x2a, 0x09) {
		t.Fatalf("after resize: %v, want CAPACITY DATA HAS CHANGED", err)
	}
	if err := do(0, readCap16, buf[:32]); err != nil || be.BigEndian.Uint64(buf)+1 != 128<<20/512 {
		t.Fatalf("READ CAPACITY(16) after resize: %v, %d blocks", err, be.BigEndian.Uint64(buf)+1)
	}

	// Shrinking loses data: refused unless asked for.
	if out, code := blockwire(t, "admin", "--socket", sock, "resize", defaultIQN, "0", "1MiB"); code == 0 || !strings.Contains(out, "--shrink") {
		t.Fatalf("resize to a smaller size without --shrink: exit %d\n%s", code, out)
	}
	if err := do(0, readCap16, buf[:32]); err != nil || be.BigEndian.Uint64(buf)+1 != 128<<20/512 {
		t.Fatalf("a refused shrink changed the LUN: %v, %d blocks", err, be.BigEndian.Uint64(buf)+1)
	}
	adm("resize", defaultIQN, "0", "96MiB", "--shrink")
	do(0, readCap16, buf[:32]) // CAPACITY DATA HAS CHANGED
	if err := do(0, readCap16, buf[:32]); err != nil || be.BigEndian.Uint64(buf)+1 != 96<<20/512 {
		t.Fatalf("resize --shrink: %v, %d blocks", err, be.BigEndian.Uint64(buf)+1)
	}

	out := adm("sessions")
	if !strings.Contains(out, initiator.DefaultInitiatorName) || !strings.Contains(out, ":tcp:127.0.0.1:") {
		t.Fatalf("sessions:\n%s", out)
	}
	tsih := strings.Fields(strings.Split(out, "\n")[1])[0]
	adm("drop", tsih)
	// The initiator logs in again (session reinstatement) and goes on.
	if err := do(1, []byte{0, 0, 0, 0, 0, 0}, nil); err != nil && !senseIs(err, 0x29, 0x00) {
		t.Fatalf("after drop: %v", err)
	}
	if !strings.Contains(d.log.String(), "dropped by the administrator") {
		t.Fatalf("the drop is not logged:\n%s", d.log)
	}
	// The target has a session: removing its LUN needs --force.
	if out, code := blockwire(t, "admin", "--socket", sock, "remove-lun", defaultIQN, "1"); code != 1 || !strings.Contains(out, "--force") {
		t.Fatalf("remove-lun of a target with a session, without --force: exit %d\n%s", code, out)
	}
	adm("remove-lun", defaultIQN, "1", "--force")
	if out := adm("luns"); strings.Contains(out, defaultIQN+"  1") {
		t.Fatalf("luns after remove-lun:\n%s", out)
	}

	// A target added with an ACL; the ACL changed; everything saved.
	const second = "iqn.2026-11.org.blockwire:second"
	adm("add-target", second, "--size", "8MiB", "--initiators", "iqn.2026-11.org.example:x")
	discover := func(ini string) string {
		out, _ := blockwire(t, "discover", "--initiator-name", ini, d.addr)
		return out
	}
	if strings.Contains(discover(initiator.DefaultInitiatorName), second) || !strings.Contains(discover("iqn.2026-11.org.example:x"), second) {
		t.Fatalf("discovery does not follow the new target's ACL:\n%s", discover("iqn.2026-11.org.example:x"))
	}
	adm("set-initiators", second)
	if !strings.Contains(discover(initiator.DefaultInitiatorName), second) {
		t.Fatal("an emptied ACL does not admit everyone")
	}
	if out, code := blockwire(t, "admin", "--socket", sock, "save", filepath.Join(t.TempDir(), "elsewhere.toml")); code == 0 || !strings.Contains(out, "outside") {
		t.Fatalf("save outside --admin-dir: exit %d\n%s", code, out)
	}
	saved := filepath.Join(apiDir, "saved.toml")
	os.WriteFile(saved, []byte("# hand-written, with a comment\n"), 0o600)
	if out := adm("save", saved); !strings.Contains(out, `"backup"`) {
		t.Fatalf("save over a file does not report its backup:\n%s", out)
	}
	if b, _ := os.ReadFile(saved + ".bak"); string(b) != "# hand-written, with a comment\n" {
		t.Fatalf("the replaced file was not kept: %q", b)
	}
	if out, code := blockwire(t, "config", "check", saved); code != 0 {
		t.Fatalf("the saved configuration does not check (exit %d):\n%s", code, out)
	}
	b, _ := os.ReadFile(saved)
	if !strings.Contains(string(b), second) || !strings.Contains(string(b), `size = "96MiB"`) {
		t.Fatalf("saved configuration:\n%s", b)
	}
	adm("remove-target", second)
	if strings.Contains(discover(initiator.DefaultInitiatorName), second) {
		t.Fatal("a removed target is still offered")
	}
}

// TestBashCompletion: the completion script completes verbs, admin verbs
// and each verb's flags (read from its -h).
func TestBashCompletion(t *testing.T) {
	long(t)
	need(t, "bash")
	dir := t.TempDir()
	os.Symlink(binary, filepath.Join(dir, "blockwire"))
	script := `source <(blockwire completion bash)
COMP_WORDS=(blockwire be); COMP_CWORD=1; _blockwire; echo "${COMPREPLY[@]}"
COMP_WORDS=(blockwire bench --q); COMP_CWORD=2; _blockwire; echo "${COMPREPLY[@]}"
COMP_WORDS=(blockwire admin add-); COMP_CWORD=2; _blockwire; echo "${COMPREPLY[@]}"`
	cmd := exec.Command("bash", "-c", script)
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "bench\n--qd\nadd-lun add-target\n" {
		t.Fatalf("completions (%v):\n%q", err, out)
	}
}

// TestPortalsInConfig: the configuration file says which transports
// serve: iSCSI/TCP on listen, iSER there unless iser = false,
// SRP on srp_listen with its port ID.
func TestPortalsInConfig(t *testing.T) {
	long(t)
	srpAddr := freePort(t)
	cfg := filepath.Join(t.TempDir(), "portals.toml")
	os.WriteFile(cfg, []byte(`iser = false
srp_listen = ["`+srpAddr+`"]
srp_id_ext = "0011223344556677"
[[target]]
name = "iqn.2026-11.org.blockwire:portals"
[[target.lun]]
id = 0
size = "16MiB"
`), 0o600)
	d := serve(t, "--config", cfg)
	for _, u := range []string{
		"iscsi://" + d.addr + "/iqn.2026-11.org.blockwire:portals/0",
		"srp://" + srpAddr + "/0011223344556677/0",
	} {
		if out, code := blockwire(t, "inquiry", u); code != 0 || !strings.Contains(out, "capacity: 16777216 bytes") {
			t.Fatalf("inquiry %s (exit %d):\n%s", u, code, out)
		}
	}
	if out, code := blockwire(t, "inquiry", "iser://"+d.addr+"/iqn.2026-11.org.blockwire:portals/0"); code == 0 {
		t.Fatalf("iSER served with iser = false:\n%s", out)
	}
}
