package interop

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/srp/srpinitiator"
)

// TestAdminSessionsEveryFabric: one blockwire serves an
// iSCSI/TCP, an iSER and an SRP session at once; `blockwire admin sessions`
// lists each with its fabric, SRP reaches the second target (each target
// is its own SRP target port, its URL logged), and `admin drop srp-N` ends
// the SRP session.
func TestAdminSessionsEveryFabric(t *testing.T) {
	long(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "admin.sock")
	srpAddr := freePort(t)
	cfg := filepath.Join(dir, "two.toml")
	os.WriteFile(cfg, []byte(`
srp_listen = ["`+srpAddr+`"]
admin_socket = "`+sock+`"
[[target]]
name = "iqn.2026-11.org.blockwire:first"
[[target.lun]]
id = 0
size = "8MiB"
[[target]]
name = "iqn.2026-11.org.blockwire:second"
[[target.lun]]
id = 0
size = "4MiB"
[[target.lun]]
id = 1
size = "2MiB"
`), 0o600)
	d := serve(t, "--config", cfg)
	var second string
	deadline := time.Now().Add(5 * time.Second)
	for second == "" && time.Now().Before(deadline) {
		if m := regexp.MustCompile(`target=iqn.2026-11.org.blockwire:second transport=srp \S+ url=(srp://\S+)`).FindStringSubmatch(d.log.String()); m != nil {
			second = strings.TrimSuffix(m[1], "/0") + "/1"
		}
		time.Sleep(20 * time.Millisecond)
	}
	if second == "" {
		t.Fatalf("no SRP URL for the second target in the log:\n%s", d.log.String())
	}
	ctx := context.Background()
	tcp, err := initiator.Open(ctx, d.url("iqn.2026-11.org.blockwire:first", 0), initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	iser, err := initiator.Open(ctx, "iser://"+d.addr+"/iqn.2026-11.org.blockwire:first/0", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer iser.Close()
	srp, err := srpinitiator.Open(ctx, second, srpinitiator.Options{Fabric: siw.New(siw.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	defer srp.Close()
	if srp.Size() != 2<<20 {
		t.Fatalf("SRP reached %d bytes, want the second target's LUN 1 (2 MiB)", srp.Size())
	}
	out, code := blockwire(t, "admin", "--socket", sock, "sessions")
	if code != 0 {
		t.Fatalf("admin sessions: exit %d\n%s", code, out)
	}
	var srpID string
	for _, want := range []struct{ fabric, target string }{
		{"iscsi", "iqn.2026-11.org.blockwire:first"}, {"iser", "iqn.2026-11.org.blockwire:first"}, {"srp", "iqn.2026-11.org.blockwire:second"},
	} {
		m := regexp.MustCompile(`(?m)^(\S+)\s+` + want.fabric + `\s+` + regexp.QuoteMeta(want.target) + `\s`).FindStringSubmatch(out)
		if m == nil {
			t.Errorf("admin sessions shows no %s session of %s:\n%s", want.fabric, want.target, out)
		} else if want.fabric == "srp" {
			srpID = m[1]
		}
	}
	if srpID == "" {
		t.FailNow()
	}
	if out, code := blockwire(t, "admin", "--socket", sock, "drop", srpID); code != 0 {
		t.Fatalf("admin drop %s: exit %d\n%s", srpID, code, out)
	}
	buf := make([]byte, 4096)
	deadline = time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := srp.ReadAt(buf, 0); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := srp.ReadAt(buf, 0); err == nil {
		t.Error("the SRP session still reads after admin drop")
	}
	if out, _ := blockwire(t, "admin", "--socket", sock, "sessions"); strings.Contains(out, " srp ") {
		t.Errorf("the dropped SRP session is still listed:\n%s", out)
	}
}
