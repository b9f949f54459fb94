package iscsitarget

import (
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/scsitarget"
)

// blockingDisk is a memory disk that does not say it never blocks, so
// its commands run on workers rather than on the receiving goroutine.
type blockingDisk struct{ *mem.Disk }

func (blockingDisk) NonBlocking() bool { return false }

// TestITTReusedRightAfterItsResponse: once an initiator holds a
// command's response, the command is over and its ITT free (RFC 7143
// §11.2.1.8): a new command with the same ITT sent at once must run,
// even while the target is still tidying up the old task — Linux's
// initiator reuses task tags this way. It used to be rejected (Task in
// progress) when it overtook the old task's release. The receiver waits
// for that release without spinning: a peer may reuse the ITT of a task
// whose answer it does not take, and the wait (up to a second) must not
// burn a core.
func TestITTReusedRightAfterItsResponse(t *testing.T) {
	m, err := mem.New(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	var held atomic.Bool
	const holdITT = 0x40
	ts := startServer(t, Options{NopInterval: -1, afterRespond: func(itt uint32) {
		if itt == holdITT && !held.Swap(true) {
			time.Sleep(300 * time.Millisecond) // the old task's release, late
		}
	}}, onLU(t, scsitarget.LUConfig{Backend: blockingDisk{m}}))
	c := dial(t, ts.addr)
	c.mustLogin(normalKeys(ini)...)
	c.command(tur(), false, 0, nil, 0) // takes the power-on unit attention
	c.itt = holdITT
	if r := c.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("first TEST UNIT READY: status %#x", r.status)
	}
	c.itt-- // the same ITT again, at once
	start, cpu0 := time.Now(), cpuTime()
	if r := c.command(tur(), false, 0, nil, 0); r.status != 0 {
		t.Fatalf("TEST UNIT READY reusing the ITT: status %#x", r.status)
	}
	if d, cpu := time.Since(start), cpuTime()-cpu0; cpu > d/4 {
		t.Fatalf("the process used %v of CPU in the %v the receiver waited for the old task", cpu, d)
	}
	if !held.Load() {
		t.Fatal("the hook never held a release: the test proves nothing")
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("the second command was answered after %v, before the first one's task was released", d)
	}
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
