package interop

import (
	"bytes"
	"context"
	"crypto/rand"
	be "encoding/binary"
	"errors"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
)

// TestAcknowledgedWritesSurviveSIGKILL writes blocks with FUA from several
// goroutines into a file-backed LUN, kills blockwire with SIGKILL in the
// middle, restarts it on the same file and checks that every write that
// was acknowledged reads back exactly and that blocks never written are
// still zero. (A process crash keeps the page cache; a machine crash is
// the guest lab's to test.)
func TestAcknowledgedWritesSurviveSIGKILL(t *testing.T) {
	long(t)
	img := filepath.Join(t.TempDir(), "durable.img")
	d := serve(t, "--file", img, "--size", "64MiB")
	ctx := context.Background()
	dev, err := initiator.Open(ctx, d.url(defaultIQN, 0), initiator.Options{Dialer: &fabric.Dialer{}, RecoveryTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	const blocks = 64 << 20 / 4096
	var mu sync.Mutex
	acked := map[uint64][]byte{}    // 4 KiB block -> content acknowledged
	inflight := map[uint64][]byte{} // writes sent but not acknowledged at the kill
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				blk := (uint64(w) + i*8) % (blocks / 2) // the upper half stays unwritten
				buf := make([]byte, 4096)
				rand.Read(buf)
				cdb := make([]byte, 16)
				cdb[0], cdb[1] = 0x8a, 0x08 // WRITE(16) with FUA
				be.BigEndian.PutUint64(cdb[2:], blk*8)
				be.BigEndian.PutUint32(cdb[10:], 8)
				mu.Lock()
				inflight[blk] = buf
				mu.Unlock()
				if _, err := dev.Do(ctx, cdb, buf, nil); err != nil {
					var se *initiator.SCSIError
					if errors.As(err, &se) && se.Sense != nil && se.Sense.Key == 6 {
						continue // unit attention
					}
					return // the target is gone
				}
				mu.Lock()
				acked[blk] = buf
				delete(inflight, blk)
				mu.Unlock()
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond)
	d.cmd.Process.Signal(syscall.SIGKILL)
	close(stop)
	wg.Wait()
	<-d.done
	d.done <- nil
	mu.Lock()
	n := len(acked)
	mu.Unlock()
	if n < 100 {
		t.Fatalf("only %d writes acknowledged before the kill", n)
	}
	d2 := serve(t, "--file", img)
	dev2, err := initiator.Open(ctx, d2.url(defaultIQN, 0), initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev2.Close()
	buf := make([]byte, 4096)
	for blk, want := range acked {
		if _, err := dev2.ReadAt(buf, int64(blk)*4096); err != nil {
			t.Fatal(err)
		}
		// The write in flight at the kill may or may not have landed.
		if !bytes.Equal(buf, want) && !bytes.Equal(buf, inflight[blk]) {
			t.Fatalf("block %d: acknowledged FUA write lost or changed after SIGKILL", blk)
		}
	}
	zero := make([]byte, 1<<20)
	for off := int64(32 << 20); off < 64<<20; off += int64(len(zero)) {
		if _, err := dev2.ReadAt(zero, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(zero, make([]byte, len(zero))) {
			t.Fatalf("data appeared at %d, where nothing was written", off)
		}
	}
	t.Logf("%d acknowledged FUA writes of 4 KiB all read back after SIGKILL and restart", n)
}
