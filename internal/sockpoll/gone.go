package sockpoll

import (
	"net"

	"github.com/blockwire/blockwire/internal/prefixconn"
	"golang.org/x/sys/unix"
)

// Gone reports whether the kernel already knows nc's connection to be
// over: the peer closed its side or reset it, or nc itself is closed. It
// asks poll(2) without waiting and reads nothing, so the connection's
// reader still finds what is left, then the end. False when nc is no TCP
// socket: nothing is known then.
func Gone(nc net.Conn) bool {
	tc := prefixconn.TCP(nc)
	if tc == nil {
		return false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return true // closed here
	}
	gone := false
	if err := rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(fds, 0)
		gone = err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
	}); err != nil {
		return true // closed here
	}
	return gone
}
