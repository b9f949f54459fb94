//go:build verbs && linux && cgo

package verbs

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// The verbs build's helpers that need no cgo themselves.

var errClosed = errors.New("verbs: device closed")

func (o *Options) defaults() {
	if o.MaxMemory <= 0 {
		o.MaxMemory = 256 << 20
	}
	if o.Backlog <= 0 {
		o.Backlog = 64
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// checkMemlock reports, at start, a locked-memory limit too small for
// the registered memory the device may take: registration pins pages and
// counts them against RLIMIT_MEMLOCK unless the process holds
// CAP_IPC_LOCK (root does) — except on siw, which counts every process
// against the limit. Found here, it names the limit and the size needed;
// found later, it would be an I/O failure.
func checkMemlock(dev string, need int) error {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(memlockResource, &rl); err != nil {
		return nil
	}
	return memlockError(rl.Cur, need, hasIPCLock() && !countsEveryone(dev))
}

// countsEveryone reports a device whose driver applies RLIMIT_MEMLOCK to
// privileged processes too: siw (its registration checks the limit
// itself), by the name rdma link gives it.
func countsEveryone(dev string) bool { return strings.HasPrefix(dev, "siw") }

// memlockResource is RLIMIT_MEMLOCK on Linux.
const memlockResource = 8

// hasIPCLock reports whether the process holds CAP_IPC_LOCK (bit 14 of
// the effective capabilities), which lifts the memlock limit.
func hasIPCLock() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<14) != 0
		}
	}
	return false
}

func portState(s int) string {
	switch s {
	case 1:
		return "down"
	case 2:
		return "init"
	case 3:
		return "armed"
	case 4:
		return "active"
	case 5:
		return "active-defer"
	}
	return fmt.Sprintf("state %d", s)
}

// netdevOf is the network device of port 1 (sysfs; "" when none): the
// one its first GID belongs to on RoCE; on iWARP (siw has no GID
// attributes) the one whose MAC address the node GUID is made from, as
// siw and rxe make it (EUI-64: ff:fe in the middle, the
// universal/local bit flipped).
func netdevOf(dev string, guid uint64) string {
	if b, err := os.ReadFile(filepath.Join("/sys/class/infiniband", dev, "ports/1/gid_attrs/ndevs/0")); err == nil {
		return string(trimNL(b))
	}
	nets, err := os.ReadDir("/sys/class/net")
	if err != nil || guid == 0 {
		return ""
	}
	for _, n := range nets {
		b, err := os.ReadFile(filepath.Join("/sys/class/net", n.Name(), "address"))
		if err != nil {
			continue
		}
		mac, err := net.ParseMAC(string(trimNL(b)))
		if err != nil || len(mac) != 6 {
			continue
		}
		eui := uint64(mac[0]^0x02)<<56 | uint64(mac[1])<<48 | uint64(mac[2])<<40 | 0xfffe<<24 |
			uint64(mac[3])<<16 | uint64(mac[4])<<8 | uint64(mac[5])
		if eui == guid {
			return n.Name()
		}
	}
	return ""
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == 0) {
		b = b[:len(b)-1]
	}
	return b
}
