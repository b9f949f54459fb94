package file

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// lock takes an open file description lock on the whole of f — shared for
// a read-only server, exclusive otherwise — so that one image has one
// server: a second blockwire (or QEMU, which locks its images the same
// way) is refused instead of keeping a second cache and a second
// reservation state on the same disk. The lock belongs to f's open file
// description, so it holds against other opens in this process too, and
// ends when f is closed (or the process dies).
func lock(f *os.File, path string, readOnly bool) error {
	typ := int16(unix.F_WRLCK)
	if readOnly {
		typ = unix.F_RDLCK
	}
	deadline := time.Now().Add(lingerWait)
	for {
		lk := unix.Flock_t{Type: typ, Whence: 0, Start: 0, Len: 0}
		err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
		switch err {
		case nil:
			return nil
		case unix.EAGAIN, unix.EACCES:
			h := holder(f)
			if h == "" && time.Now().Before(deadline) {
				// No process holds it: a server that just ended, whose
				// io_uring the kernel tears down after the process has
				// gone (the ring keeps the file open until then).
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return fmt.Errorf("file: %s is in use by another server%s: an image has one server (stop the other, or serve it read-only from both)", path, h)
		case unix.EINVAL, unix.ENOLCK, unix.EOPNOTSUPP:
			return nil // a filesystem without such locks: nothing to enforce with
		}
		return fmt.Errorf("file: lock %s: %w", path, err)
	}
}

// lingerWait is how long lock waits for a lock no live process holds:
// after a server is killed its io_uring may keep the file, and so the
// lock, for a moment.
const lingerWait = 5 * time.Second

// holder names the processes holding a lock on f's file, as far as /proc
// lets us see them: OFD locks report no owner (F_OFD_GETLK gives pid -1),
// so it looks for open files on the same inode whose fdinfo lists a lock.
func holder(f *os.File) string {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return ""
	}
	// A lock line: "lock:\t1: OFDLCK ADVISORY WRITE -1 fe:00:9978042 0 EOF";
	// the device is major:minor in hex.
	id := fmt.Sprintf("%02x:%02x:%d ", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	procs, _ := filepath.Glob("/proc/[0-9]*/fdinfo/*")
	seen := map[int]bool{}
	var out []byte
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte("lock:")) || !bytes.Contains(b, []byte(id)) {
			continue
		}
		pidDir := filepath.Dir(filepath.Dir(p))
		pid, _ := strconv.Atoi(filepath.Base(pidDir))
		if seen[pid] { // (f's own fdinfo lists only its own locks: none)
			continue
		}
		seen[pid] = true
		comm, _ := os.ReadFile(filepath.Join(pidDir, "comm"))
		out = fmt.Appendf(out, ", pid %d (%s)", pid, bytes.TrimSpace(comm))
	}
	if len(out) == 0 {
		return ""
	}
	return " (held by" + string(out[1:]) + ")"
}
