package initiator

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"testing"

	"github.com/blockwire/blockwire/datamover/iser"
	iscsitarget "github.com/blockwire/blockwire/iscsi/target"
	"github.com/blockwire/blockwire/rdma/roce"
	scsitarget "github.com/blockwire/blockwire/target"
)

// iSER over the software RoCEv2 device: the connection made with the
// InfiniBand CM over UDP (REQ with the RDMA/CM header and the iSER CM
// header, REP, RTU), login in RC SENDs, data by RDMA WRITE and READ in
// 1024-byte packets — the same SCSI workload as over TCP and iWARP.
func TestISEROverRoCE(t *testing.T) {
	const port = 24791
	tdev, err := roce.Open("127.0.0.2", roce.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer tdev.Close()
	idev, err := roce.Open("127.0.0.1", roce.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer idev.Close()
	srv := newTargetServer(t, scsitarget.LUConfig{}, nil, iscsitarget.Options{})
	ln, err := tdev.Listen("127.0.0.2:3260")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeISER(ln, tdev.RDMA().AllocPD(), iser.Options{})

	ctx := context.Background()
	d, err := Open(ctx, fmt.Sprintf("iser://127.0.0.2:3260/%s/0", tIQN), Options{RDMA: idev})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if tr := d.s.links[0].dm.(*iser.Conn).Transport(); tr != "roce" {
		t.Fatalf("transport %q", tr)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for _, n := range []int{512, 4096, 65536, 300 << 10} {
				data := make([]byte, n)
				rand.Read(data)
				off := int64(g) * (1 << 20)
				if _, err := d.WriteAt(data, off); err != nil {
					errs <- fmt.Errorf("write %d: %w", n, err)
					return
				}
				back := make([]byte, n)
				if _, err := d.ReadAt(back, off); err != nil {
					errs <- fmt.Errorf("read %d: %w", n, err)
					return
				}
				if !bytes.Equal(back, data) {
					errs <- fmt.Errorf("%d bytes at %d: read back differs", n, off)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
