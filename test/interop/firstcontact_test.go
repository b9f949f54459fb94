package interop

import (
	"bytes"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeFileKeepsAnExistingImage: `serve --file` on an existing image
// serves it at its own size and leaves the file as it was; a --size that
// differs is refused (a 64 MiB image was grown to 1 GiB, and a
// 2 GiB one was served as 1 GiB, silently).
func TestServeFileKeepsAnExistingImage(t *testing.T) {
	long(t)
	dir := t.TempDir()
	small := filepath.Join(dir, "small.img")
	big := filepath.Join(dir, "big.img")
	for p, n := range map[string]int64{small: 64 << 20, big: 2 << 30} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Truncate(p, n)
	}
	for p, blocks := range map[string]string{small: "blocks=131072", big: "blocks=4194304"} {
		d := serve(t, "--file", p)
		if !strings.Contains(d.log.String(), blocks) {
			t.Errorf("%s: served without %s:\n%s", filepath.Base(p), blocks, d.log)
		}
		d.stop(10 * time.Second)
	}
	if st, _ := os.Stat(small); st.Size() != 64<<20 {
		t.Fatalf("serving grew the 64 MiB image to %d bytes", st.Size())
	}
	out, code := blockwire(t, "serve", "--listen", freePort(t), "--file", small, "--size", "1GiB")
	if code == 0 || !strings.Contains(out, "grow") {
		t.Fatalf("--size larger than the image: exit %d\n%s", code, out)
	}
	out, code = blockwire(t, "serve", "--listen", freePort(t), "--file", big, "--size", "1GiB")
	if code == 0 || !strings.Contains(out, "shrink") {
		t.Fatalf("--size smaller than the image: exit %d\n%s", code, out)
	}
	if st, _ := os.Stat(small); st.Size() != 64<<20 {
		t.Fatalf("a refused serve changed the image to %d bytes", st.Size())
	}
	d := serve(t, "--file", small, "--size", "128MiB", "--grow")
	if !strings.Contains(d.log.String(), "blocks=262144") {
		t.Fatalf("--grow: %s", d.log)
	}
	d.stop(10 * time.Second)
	fresh := filepath.Join(dir, "fresh.img")
	d = serve(t, "--file", fresh)
	d.stop(10 * time.Second)
	if st, err := os.Stat(fresh); err != nil || st.Size() != 1<<30 {
		t.Fatalf("a missing file is created at the default size: %v", err)
	}
}

// TestAdminSocketNeverTakenOver: a second serve with the same
// --admin-socket fails and names the running one, which stays reachable;
// the socket is never reachable by others (mode 0600 from the start); a
// file that is not a socket is not replaced.
func TestAdminSocketNeverTakenOver(t *testing.T) {
	long(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "admin.sock")
	serve(t, "--admin-socket", sock)
	st, err := os.Stat(sock)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v mode %v", err, st.Mode())
	}
	out, code := blockwire(t, "serve", "--listen", freePort(t), "--admin-socket", sock)
	if code == 0 || !strings.Contains(out, "in use by process") {
		t.Fatalf("second serve on a live socket: exit %d\n%s", code, out)
	}
	if out, code := blockwire(t, "admin", "--socket", sock, "luns"); code != 0 || !strings.Contains(out, defaultIQN) {
		t.Fatalf("the first daemon is no longer reachable: exit %d\n%s", code, out)
	}
	plain := filepath.Join(dir, "notasocket")
	os.WriteFile(plain, []byte("data"), 0o600)
	if out, code := blockwire(t, "serve", "--listen", freePort(t), "--admin-socket", plain); code == 0 || !strings.Contains(out, "not a socket") {
		t.Fatalf("--admin-socket on a regular file: exit %d\n%s", code, out)
	}
	if b, _ := os.ReadFile(plain); string(b) != "data" {
		t.Fatal("the regular file was replaced")
	}
}

// TestAdminHTTPNeedsTheToken: --admin-http writes a 0600 token file; the
// admin client with --url and that file works, a request without it (as a
// web page would send) is refused and changes nothing.
func TestAdminHTTPNeedsTheToken(t *testing.T) {
	long(t)
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	api := freePort(t)
	serve(t, "--admin-http", api, "--admin-http-token", tok)
	st, err := os.Stat(tok)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v", err)
	}
	if out, code := blockwire(t, "admin", "--url", "http://"+api, "--token-file", tok, "add-lun", defaultIQN, "1", "--size", "8MiB"); code != 0 {
		t.Fatalf("admin over HTTP: exit %d\n%s", code, out)
	}
	out, _ := run(t, 10*time.Second, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H", "Content-Type: text/plain",
		"--data", `{"target":"`+defaultIQN+`","lun":2,"size":"8MiB"}`, "http://"+api+"/luns")
	if strings.TrimSpace(out) != "415" {
		t.Fatalf("a cross-site style POST: HTTP %s", out)
	}
	out, code := blockwire(t, "admin", "--url", "http://"+api, "--token-file", tok, "luns")
	if code != 0 || !strings.Contains(out, defaultIQN+"  1") || strings.Contains(out, defaultIQN+"  2") {
		t.Fatalf("luns: exit %d\n%s", code, out)
	}
}

// TestCopyToAFileIsSparse: copying a LUN to a file makes a file exactly
// the LUN's size whose zeroed ranges are holes, as qemu-img's are; an
// existing larger file is replaced (with --force), not left with a stale tail (once
// the copy was fully allocated).
func TestCopyToAFileIsSparse(t *testing.T) {
	long(t)
	d := serve(t, "--size", "64MiB")
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	data := make([]byte, 8<<20)
	rand.Read(data)
	os.WriteFile(src, data, 0o600)
	if out, code := blockwire(t, "copy", src, d.url(defaultIQN, 0)); code != 0 {
		t.Fatalf("copy in: exit %d\n%s", code, out)
	}
	back := filepath.Join(dir, "back.img")
	os.WriteFile(back, bytes.Repeat([]byte{0xff}, 80<<20), 0o600) // larger, and not zero
	// Replacing a file that holds data is asked for (--force).
	if out, code := blockwire(t, "copy", "--force", d.url(defaultIQN, 0), back); code != 0 {
		t.Fatalf("copy out: exit %d\n%s", code, out)
	}
	st, err := os.Stat(back)
	if err != nil || st.Size() != 64<<20 {
		t.Fatalf("copy is %d bytes, want the LUN's 64 MiB: %v", st.Size(), err)
	}
	allocated := st.Sys().(*syscall.Stat_t).Blocks * 512
	if allocated > 12<<20 {
		t.Fatalf("a 64 MiB LUN with 8 MiB of data copied to a file allocating %d MiB", allocated>>20)
	}
	got, _ := os.ReadFile(back)
	if !bytes.Equal(got[:len(data)], data) || !bytes.Equal(got[len(data):], make([]byte, len(got)-len(data))) {
		t.Fatal("the sparse copy reads back different data")
	}
	t.Logf("64 MiB LUN with 8 MiB written: the file copy allocates %d MiB", allocated>>20)
}

// TestCHAPSecretOffTheCommandLine: the initiator verbs take the CHAP
// secret from a file or the environment, the URL naming only the user, so
// it never shows in ps.
func TestCHAPSecretOffTheCommandLine(t *testing.T) {
	long(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "chap.toml")
	os.WriteFile(cfg, []byte(`
[[target]]
name = "iqn.2026-11.org.blockwire:chap"
[target.chap]
user = "u1"
secret = "a-secret-of-16b!"
[[target.lun]]
id = 0
size = "8MiB"
`), 0o600)
	d := serve(t, "--config", cfg)
	url := "iscsi://u1@" + d.addr + "/iqn.2026-11.org.blockwire:chap/0"
	secret := filepath.Join(dir, "secret")
	os.WriteFile(secret, []byte("a-secret-of-16b!\n"), 0o600)
	if out, code := blockwire(t, "inquiry", "--chap-secret-file", secret, url); code != 0 {
		t.Fatalf("secret from a file: exit %d\n%s", code, out)
	}
	cmd := exec.Command(binary, "inquiry", url)
	cmd.Env = append(os.Environ(), "BLOCKWIRE_CHAP_SECRET=a-secret-of-16b!")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("secret from the environment: %v\n%s", err, out)
	}
	if out, code := blockwire(t, "inquiry", url); code != 4 {
		t.Fatalf("no secret anywhere: exit %d, want 4 (login refused)\n%s", code, out)
	}
}

// TestReadmeCommands runs the README's commands literally against a fresh
// `blockwire serve` (only its port differs, and disk.img is made first):
// a newcomer who follows them reaches the LUN from libiscsi, QEMU and
// blockwire itself.
func TestReadmeCommands(t *testing.T) {
	long(t)
	need(t, "iscsi-ls", "iscsi-inq", "qemu-img")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	d := serve(t)
	dir := t.TempDir()
	img := make([]byte, 4<<20)
	rand.Read(img)
	os.WriteFile(filepath.Join(dir, "disk.img"), img, 0o600)
	var ran []string
	for _, m := range regexp.MustCompile("`((?:iscsi-ls|iscsi-inq|qemu-img convert|blockwire inquiry) [^`]+)`").FindAllStringSubmatch(string(readme), -1) {
		line := strings.ReplaceAll(m[1], "127.0.0.1:3260", d.addr)
		args := strings.Fields(line)
		if args[0] == "blockwire" {
			args[0] = binary
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("README command %q: %v\n%s", m[1], err, out)
		}
		ran = append(ran, args[0])
	}
	if len(ran) < 4 {
		t.Fatalf("found only %d of the README's connection commands: %v", len(ran), ran)
	}
	back := filepath.Join(dir, "back.img")
	mustRun(t, time.Minute, "qemu-img", "convert", "-f", "raw", "-O", "raw", d.url(defaultIQN, 0), back)
	sameFirst(t, filepath.Join(dir, "disk.img"), back, 4<<20)
}
