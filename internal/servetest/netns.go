package servetest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// Netns makes a network namespace whose loopback is up and holds addrs
// (as ip-address(8) takes them: one alone is a /128 or /32; no duplicate
// address detection), deleted when t ends, and returns its name; it skips
// t where namespaces cannot be made (not root, no ip(8)). Sockets are
// made in it with InNetns.
func Netns(t testing.TB, addrs ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip(8) (apt-get install iproute2)")
	}
	ns := fmt.Sprintf("bwtest%d-%08x", os.Getpid(), rand.Uint32())
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	ip("-n", ns, "link", "set", "lo", "up")
	for _, a := range addrs {
		ip("-n", ns, "addr", "add", a, "dev", "lo", "nodad")
	}
	return ns
}

// InNetns runs f on a thread that has joined network namespace ns, so
// the sockets f makes live there (they stay there, whichever thread uses
// them later); t fails with f's error.
func InNetns(t testing.TB, ns string, f func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		h, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer h.Close()
		if err := unix.Setns(int(h.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
