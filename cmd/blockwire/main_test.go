package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blockwire/blockwire/rdma/verbs"
)

// TestHelpAndExitCodes: every verb's -h/--help exits 0; usage errors exit
// 2 and name the problem — bad flags, extra arguments, malformed URLs
// (no LUN, a port out of range, IPv6 without brackets), unknown admin
// verbs, inputs that would be silently adjusted.
func TestHelpAndExitCodes(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.toml")
	os.WriteFile(empty, []byte("listen = [\"127.0.0.1:3260\"]\n"), 0o600)
	odd := filepath.Join(dir, "odd.bin")
	os.WriteFile(odd, make([]byte, 1000), 0o600)
	u := "iscsi://127.0.0.1:1/iqn.2026-11.org.example:t/0"
	intSize := filepath.Join(dir, "int.toml")
	os.WriteFile(intSize, []byte("[[target]]\nname = \"iqn.2026-11.org.example:t\"\n[[target.lun]]\nid = 0\nsize = 1048576\n"), 0o600)
	// A CHAP secret others can read: a warning, refused with --strict.
	exposed := filepath.Join(dir, "exposed.toml")
	os.WriteFile(filepath.Join(dir, "open.secret"), []byte("a-secret-of-sixteen\n"), 0o644)
	os.WriteFile(exposed, []byte("[[target]]\nname = \"iqn.2026-11.org.example:t\"\n[target.chap]\nuser = \"u\"\nsecret_file = \"open.secret\"\n[[target.lun]]\nid = 0\nsize = \"1MiB\"\n"), 0o600)
	os.Chmod(filepath.Join(dir, "open.secret"), 0o644)
	for _, c := range []struct {
		args []string
		code int
		says string // in stdout+stderr
	}{
		{[]string{"--help"}, 0, "Usage"},
		{[]string{"serve", "-h"}, 0, "-listen"},
		{[]string{"serve", "--help"}, 0, "-listen"},
		{[]string{"inquiry", "--help"}, 0, "-initiator-name"},
		{[]string{"read", "-h"}, 0, "-offset"},
		{[]string{"write", "-h"}, 0, "-in"},
		{[]string{"copy", "-h"}, 0, ""},
		{[]string{"bench", "-h"}, 0, "-verify"},
		{[]string{"discover", "-h"}, 0, ""},
		{[]string{"admin", "-h"}, 0, "sessions"},
		{[]string{"config", "check", "--help"}, 0, "config check [--strict] FILE"},
		{[]string{"config", "check", "-h"}, 0, "config check [--strict] FILE"},
		{[]string{"bogus"}, 2, `unknown command "bogus"`},
		{[]string{"admin", "--socket", filepath.Join(dir, "s"), "bogus"}, 2, `unknown admin verb "bogus"`},
		{[]string{"serve", "extra-arg"}, 2, `unexpected argument "extra-arg"`},
		{[]string{"serve", "--config", empty, "--size", "2GiB"}, 2, "--size"},
		{[]string{"serve", "--config", empty, "--iqn", "iqn.2026-11.org.example:x"}, 2, "--iqn"},
		{[]string{"serve", "--size", "1000"}, 2, "--size: 1000 bytes is not a multiple of the 512-byte block"},
		{[]string{"serve", "--size", "-1"}, 2, "--size"},
		{[]string{"config", "check", empty}, 1, "serves nothing"},
		{[]string{"inquiry", "iscsi://127.0.0.1:1/iqn.2026-11.org.example:t"}, 2, "LUN"},
		{[]string{"inquiry", "iscsi://127.0.0.1:99999/iqn.2026-11.org.example:t/0"}, 2, "port"},
		{[]string{"inquiry", "iscsi://::1:3260/iqn.2026-11.org.example:t/0"}, 2, "brackets"},
		{[]string{"bench", "--time", "-1s", u}, 2, "--time"},
		{[]string{"bench", "--rw", "randread", "--verify", u}, 2, "--overwrite"},
		{[]string{"write", "--overwrite", "--in", odd, u}, 2, "not a multiple"},
		{[]string{"write", "--in", odd, u}, 2, "--overwrite"},
		{[]string{"bench", "--rw", "write", u}, 2, "--overwrite"},
		{[]string{"inquiry", u}, 3, ""},
		{[]string{"admin", "--socket", filepath.Join(dir, "none.sock"), "luns"}, 3, "is blockwire serve running with --admin-socket"},
		{[]string{"config", "check", intSize}, 1, "as a string in quotes"},
		{[]string{"config", "check", exposed}, 0, "mode 0644: group or others can read the secret"},
		{[]string{"config", "keys"}, 0, "rdma_memory                            size (a string such as \"64MiB\")    256MiB"},
		{[]string{"config", "check", "--strict", exposed}, 1, "chmod 600"},
		{[]string{"serve", "--config", exposed, "--strict-secrets", "--listen", "127.0.0.1:0"}, 1, "refused (--strict-secrets)"},
	} {
		var out, errOut bytes.Buffer
		code := run(c.args, &out, &errOut)
		all := out.String() + errOut.String()
		if code != c.code || !strings.Contains(all, c.says) {
			t.Errorf("blockwire %s: exit %d, want %d with %q:\n%s", strings.Join(c.args, " "), code, c.code, c.says, all)
		}
	}
}

// TestRDMAListsOrSaysWhatToDo: "blockwire rdma" lists the kernel RDMA
// devices, or — on a host with none, where rdma-core answers with an
// error — says how to make one and that the software devices need none,
// rather than only the error; a build without verbs support says so.
func TestRDMAListsOrSaysWhatToDo(t *testing.T) {
	var out, errb bytes.Buffer
	rc := rdmaDevices(nil, &out, &errb)
	switch {
	case !verbs.Supported:
		if rc != 1 || !strings.Contains(errb.String(), "without RDMA hardware support") || !strings.Contains(errb.String(), "need none") {
			t.Errorf("a build without verbs: rc %d, %q", rc, errb.String())
		}
	case strings.HasPrefix(out.String(), "no kernel RDMA device"):
		if rc != 0 || !strings.Contains(out.String(), "rdma link add rxe0 type rxe") || !strings.Contains(out.String(), "need none") {
			t.Errorf("no device: rc %d, %q", rc, out.String())
		}
	default:
		if rc != 0 || !strings.HasPrefix(out.String(), "DEVICE") {
			t.Errorf("devices: rc %d, %q %q", rc, out.String(), errb.String())
		}
	}
}
