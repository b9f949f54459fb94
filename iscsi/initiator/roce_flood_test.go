package initiator

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/rdma/roce/rocetest"
	"github.com/blockwire/blockwire/scsitarget"
)

// TestSpoofedConnectionRequestFlood: InfiniBand CM REQs over RoCEv2 from
// forged loopback sources, 2000 a second for 10 s, each answered with a
// REP whose RTU never comes. The target used to prepare each one's whole
// receive ring (~1.6 MiB) before the REP and hold up to its login limit
// of them for the RTU's 2.2 s: 400 MiB and more, and every place for a
// login taken. Now a set-up holds a few login-sized buffers, and the
// oldest set-up gives its place to a newer one: the live memory grows by
// less than 64 MiB, and a genuine initiator logs in and moves data during
// the flood; once the flood has timed out, its memory is given back.
func TestSpoofedConnectionRequestFlood(t *testing.T) {
	const port = 24797
	idev, _, srv := serveISEROverRoCEServer(t, port, scsitarget.LUConfig{})
	target := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), port)
	sp := newREQSpoofer(t, 64, target)
	before := liveMemory()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var sent int
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		end := time.Now().Add(10 * time.Second)
		for time.Now().Before(end) && ctx.Err() == nil {
			<-tick.C
			for range 2 {
				sp.send(sent)
				sent++
			}
		}
	})
	var peak uint64
	wg.Go(func() {
		for ctx.Err() == nil {
			peak = max(peak, liveMemory())
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	})

	time.Sleep(3 * time.Second)
	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Second)
	d, err := Open(dctx, fmt.Sprintf("iser://127.0.0.2:3260/%s/0", tIQN), Options{Dialer: &fabric.Dialer{RDMA: idev}})
	dcancel()
	if err != nil {
		cancel()
		wg.Wait()
		t.Fatalf("a genuine iSER login during the flood: %v", err)
	}
	if tr := d.s.links[0].dm.(*iser.Conn).Transport(); tr != "roce" {
		t.Fatalf("transport %q", tr)
	}
	data := bytes.Repeat([]byte("genuine!"), 8192)
	if _, err := d.WriteAt(data, 1<<20); err != nil {
		t.Fatalf("a genuine write during the flood: %v", err)
	}
	back := make([]byte, len(data))
	if _, err := d.ReadAt(back, 1<<20); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("a genuine read during the flood: %v (same data: %v)", err, bytes.Equal(back, data))
	}
	d.Close()

	time.Sleep(8 * time.Second) // the rest of the flood
	cancel()
	wg.Wait()
	grew := int64(peak) - int64(before)
	evicted := srv.BoundsHit()["logins_setup_evicted"]
	t.Logf("%d spoofed REQs, %d set-ups evicted; live memory %d MiB before, %d MiB at its peak", sent, evicted, before>>20, peak>>20)
	if evicted < 1000 {
		t.Errorf("%d set-ups evicted: the flood did not fill the places for logins", evicted)
	}
	if grew > 64<<20 {
		t.Fatalf("live memory grew by %d MiB under the flood, want under 64", grew>>20)
	}
	// Nothing of the flood stays once its requests have timed out.
	time.Sleep(3 * time.Second)
	if after := liveMemory(); after > before+16<<20 {
		t.Errorf("live memory %d MiB after the flood, %d MiB before it", after>>20, before>>20)
	}
}

// liveMemory is the heap and stacks in use after a collection.
func liveMemory() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

// reqSpoofer sends InfiniBand CM REQs for RDMA/CM port 3260, with the
// iSER CM header, over RoCEv2 from loopback addresses that answer
// nothing: what a peer forging its source addresses sends.
type reqSpoofer struct {
	t     *testing.T
	peers []*rocetest.Peer
}

func newREQSpoofer(t *testing.T, sources int, to netip.AddrPort) *reqSpoofer {
	sp := &reqSpoofer{t: t}
	for i := range sources {
		p, err := rocetest.Dial(netip.AddrFrom4([4]byte{127, 0, 4, byte(i + 1)}), to)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		sp.peers = append(sp.peers, p)
	}
	return sp
}

// send sends the n-th REQ, from the n-th source in turn.
func (sp *reqSpoofer) send(n int) {
	p := sp.peers[n%len(sp.peers)]
	req, err := p.REQ(3260, p.Addr().Addr(), iser.CMHeader{ZBVANotSupported: true}.Append(nil))
	if err == nil {
		err = p.SendREQ(req)
	}
	if err != nil {
		sp.t.Error(err)
	}
}
