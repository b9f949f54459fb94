package node

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/blockwire/blockwire/internal/atomicfile"
)

// listenAdminSocket listens on the administration socket at path. The
// socket is created under umask 0177, so it is never — not even between
// bind and a chmod — reachable by other users. A path where another
// process is listening is never taken over (the error names that
// process); a stale socket of an earlier run is replaced; anything that is
// not a socket is left alone.
func listenAdminSocket(path string) (net.Listener, error) {
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket; not replacing it", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			who := "another process"
			if uc, ok := c.(*net.UnixConn); ok {
				if raw, err := uc.SyscallConn(); err == nil {
					raw.Control(func(fd uintptr) {
						if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
							who = fmt.Sprintf("process %d", cred.Pid)
							if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", cred.Pid)); err == nil {
								who += " (" + filepath.Base(exe) + ")"
							}
						}
					})
				}
			}
			c.Close()
			return nil, fmt.Errorf("%s is in use by %s: is another blockwire serve running? Stop it or choose another --admin-socket", path, who)
		} else if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if err := os.Remove(path); err != nil { // stale: nobody listens
			return nil, err
		}
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	return l, nil
}

// writeToken makes the per-run token of the HTTP administration API and
// writes it to path (mode 0600, its directory created 0700 when missing).
func writeToken(path string) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b[:])
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	if err := atomicfile.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", err
	}
	return tok, nil
}

// DefaultTokenFile is where serve writes, and admin reads, the HTTP API's
// token unless told otherwise: the runtime directory (systemd's
// RUNTIME_DIRECTORY, else XDG_RUNTIME_DIR), else the user's configuration
// directory.
func DefaultTokenFile() string {
	if d := os.Getenv("RUNTIME_DIRECTORY"); d != "" {
		return filepath.Join(d, "admin-http.token")
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "blockwire", "admin-http.token")
	}
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "blockwire", "admin-http.token")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("blockwire-%d", os.Getuid()), "admin-http.token")
}
