package interop

import (
	"context"
	be "encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
)

// TestReloadOnSIGHUP: a changed configuration file is applied
// on SIGHUP without a restart, only the difference: a LUN added and a LUN
// resized are seen by an initiator that stays connected (unit attentions,
// then REPORT LUNS and READ CAPACITY), a new target is offered, an ACL
// change admits another initiator, a removed target is gone; a file with
// errors changes nothing.
func TestReloadOnSIGHUP(t *testing.T) {
	long(t)
	const (
		one = "iqn.2026-11.org.example:one"
		two = "iqn.2026-11.org.example:two"
		a   = "iqn.2026-11.org.blockwire:reload-a"
		b   = "iqn.2026-11.org.blockwire:reload-b"
	)
	cfg := filepath.Join(t.TempDir(), "blockwire.toml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(cfg, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`[[target]]
name = "` + a + `"
initiators = ["` + one + `"]
[[target.lun]]
id = 0
size = "64MiB"
`)
	d := serve(t, "--config", cfg)
	hup := func(want string) {
		t.Helper()
		before := len(d.log.String())
		d.cmd.Process.Signal(syscall.SIGHUP)
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(d.log.String()[before:], want) {
			if time.Now().After(deadline) {
				t.Fatalf("after SIGHUP the log does not say %q:\n%s", want, d.log.String()[before:])
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ctx := context.Background()
	dev, err := initiator.Open(ctx, d.url(a, 0), initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: one})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	s := dev.Session()
	do := func(lun uint64, cdb, in []byte) error { _, err := s.Do(ctx, lun, cdb, nil, in); return err }
	ua := func(err error, asc, ascq byte) bool {
		var se *initiator.SCSIError
		return errors.As(err, &se) && se.Sense != nil && se.Sense.ASC == asc && se.Sense.ASCQ == ascq
	}
	do(0, []byte{0, 0, 0, 0, 0, 0}, nil) // the power-on unit attention
	if _, err := initiator.Open(ctx, d.url(a, 0), initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: two}); err == nil {
		t.Fatal("an initiator outside the ACL logged in")
	}

	// A file with an error changes nothing.
	write(`[[target]]
name = "` + a + `"
[[target.lun]]
id = 0
`)
	hup("nothing changed")

	write(`[[target]]
name = "` + a + `"
initiators = ["` + one + `", "` + two + `"]
[[target.lun]]
id = 0
size = "128MiB"
[[target.lun]]
id = 1
size = "16MiB"
[[target]]
name = "` + b + `"
[[target.lun]]
id = 0
size = "8MiB"
`)
	hup("configuration reloaded")
	err = do(0, []byte{0, 0, 0, 0, 0, 0}, nil)
	for ua(err, 0x3f, 0x0e) || ua(err, 0x2a, 0x09) {
		err = do(0, []byte{0, 0, 0, 0, 0, 0}, nil)
	}
	if err != nil {
		t.Fatalf("after the reload: %v", err)
	}
	buf := make([]byte, 32)
	if err := do(0, []byte{0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0}, buf); err != nil || be.BigEndian.Uint64(buf)+1 != 128<<20/512 {
		t.Fatalf("LUN 0 after the reload: %v, %d blocks", err, be.BigEndian.Uint64(buf)+1)
	}
	if err := do(1, []byte{0, 0, 0, 0, 0, 0}, nil); err != nil && !ua(err, 0x29, 0x00) {
		t.Fatalf("LUN 1 after the reload: %v", err)
	}
	d2, err := initiator.Open(ctx, d.url(a, 0), initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: two})
	if err != nil {
		t.Fatalf("the initiator the ACL now admits: %v", err)
	}
	d2.Close()
	if out, code := blockwire(t, "discover", d.addr); code != 0 || !strings.Contains(out, b) {
		t.Fatalf("discover after adding %s (exit %d):\n%s", b, code, out)
	}

	write(`[[target]]
name = "` + a + `"
initiators = ["` + one + `", "` + two + `"]
[[target.lun]]
id = 0
size = "128MiB"
[[target.lun]]
id = 1
size = "16MiB"
`)
	hup("target removed")
	if out, _ := blockwire(t, "discover", d.addr); strings.Contains(out, b) {
		t.Fatalf("discover after removing %s:\n%s", b, out)
	}
	if err := do(0, []byte{0, 0, 0, 0, 0, 0}, nil); err != nil {
		t.Fatalf("the connected session after the second reload: %v", err)
	}
}

// TestSignalsAsOperatorsExpect: SIGHUP to a serve started without
// --config is logged and ignored — the process and its memory LUN's data
// stay; SIGINT does what SIGTERM does (logged, drained, exit 0).
func TestSignalsAsOperatorsExpect(t *testing.T) {
	long(t)
	d := serve(t, "--size", "8MiB")
	src := randomImage(t, 1<<20)
	if out, code := blockwire(t, "write", "--overwrite", d.url(defaultIQN, 0), "--in", src); code != 0 {
		t.Fatalf("write (exit %d):\n%s", code, out)
	}
	d.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.log.String(), "SIGHUP ignored") {
		select {
		case err := <-d.done:
			t.Fatalf("SIGHUP without --config ended serve (%v):\n%s", err, d.log.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGHUP without --config the log does not say it was ignored:\n%s", d.log.String())
		}
	}
	back := filepath.Join(t.TempDir(), "back")
	if out, code := blockwire(t, "read", d.url(defaultIQN, 0), "--length", "1MiB", "--out", back); code != 0 {
		t.Fatalf("read after SIGHUP (exit %d):\n%s", code, out)
	}
	sameFirst(t, src, back, 1<<20)

	d.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-d.done:
		d.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("SIGINT: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve still running 30 s after SIGINT")
	}
	if log := d.log.String(); !strings.Contains(log, `signal=interrupt`) || !strings.Contains(log, "stopped") {
		t.Fatalf("SIGINT: the log does not show the shutdown:\n%s", log)
	}
}

// TestOneServerPerImage: a second serve of an image already served is
// refused with the holder's pid, and the first keeps serving.
func TestOneServerPerImage(t *testing.T) {
	long(t)
	img := filepath.Join(t.TempDir(), "disk.img")
	first := serve(t, "--file", img, "--size", "16MiB")
	cmd := exec.Command(binary, "serve", "--listen", freePort(t), "--file", img)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use") || !strings.Contains(string(out), fmt.Sprintf("pid %d", first.cmd.Process.Pid)) {
		t.Fatalf("a second serve of %s (%v):\n%s", img, err, out)
	}
	if out, code := blockwire(t, "inquiry", first.url(defaultIQN, 0)); code != 0 {
		t.Fatalf("the first server after the second was refused (exit %d):\n%s", code, out)
	}
}
