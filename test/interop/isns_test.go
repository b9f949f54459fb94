package interop

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/servetest"
)

// TestISNSRegistration: blockwire registers its targets and
// portals with Debian's open-isns server (isnsd, on loopback), isnsadm
// lists them, and they are gone after blockwire shuts down.
func TestISNSRegistration(t *testing.T) {
	long(t)
	need(t, "isnsd", "isnsadm")
	dir := t.TempDir()
	// A port of our own: an isnsd the package installation started may
	// hold 3205.
	port := strings.Split(freePort(t), ":")[1]
	os.MkdirAll(filepath.Join(dir, "db"), 0o700)
	conf := filepath.Join(dir, "isnsd.conf")
	os.WriteFile(conf, []byte("Database = "+filepath.Join(dir, "db")+"\nPIDFile = "+filepath.Join(dir, "isnsd.pid")+
		"\nSecurity = 0\nSLPRegister = 0\nDefaultDiscoveryDomain = 1\nBindAddress = 127.0.0.1:"+port+"\n"), 0o600)
	adminConf := filepath.Join(dir, "isnsadm.conf")
	os.WriteFile(adminConf, []byte("ServerAddress = 127.0.0.1:"+port+"\nSecurity = 0\nSourceName = iqn.2026-11.org.blockwire:isnsadm\n"), 0o600)
	ctx, cancel := context.WithCancel(context.Background())
	isnsd := exec.CommandContext(ctx, "isnsd", "--config", conf, "--foreground")
	log := &servetest.LogBuffer{}
	isnsd.Stdout, isnsd.Stderr = log, log
	if err := isnsd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		isnsd.Wait()
		if t.Failed() {
			t.Logf("isnsd log:\n%s", log)
		}
	})
	list := func() string {
		out, _ := run(t, 10*time.Second, "isnsadm", "--config", adminConf, "--list", "nodes")
		return out
	}
	d := serve(t, "--isns", "127.0.0.1:"+port)
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(list(), defaultIQN) {
		if time.Now().After(deadline) {
			t.Fatalf("isnsadm does not list %s:\n%s\nblockwire:\n%s", defaultIQN, list(), d.log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, _ := run(t, 10*time.Second, "isnsadm", "--config", adminConf, "--list", "portals")
	if !strings.Contains(out, "127.0.0.1") || !strings.Contains(out, strings.Split(d.addr, ":")[1]+"/tcp") {
		t.Fatalf("isnsadm --list portals:\n%s", out)
	}
	t.Logf("isnsadm --list nodes:\n%s", list())
	d.cmd.Process.Signal(syscall.SIGTERM)
	<-d.done
	if out := list(); strings.Contains(out, defaultIQN) {
		t.Fatalf("still listed after shutdown:\n%s", out)
	}
}
