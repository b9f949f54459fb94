package initiator

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/fabric"
	iscsitarget "github.com/blockwire/blockwire/iscsi/target"
	"github.com/blockwire/blockwire/rdma/roce"
	"github.com/blockwire/blockwire/scsitarget"
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
	go srv.Serve(fabric.ISER(ln, tdev.RDMA().AllocPD(), iser.Options{}))

	ctx := context.Background()
	d, err := Open(ctx, fmt.Sprintf("iser://127.0.0.2:3260/%s/0", tIQN), Options{Dialer: &fabric.Dialer{RDMA: idev}})
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

// Seed 001 part III on InfiniBand: with a preference set, the REQ goes to
// seed 001's iSER service ID (base 0x20000 + port) with the seed's private
// data; a node of the wrong kind refuses with REJ 28 and its reason in the
// ARI; a node with no iSER service answers REJ 8, and the initiator falls
// back to iSCSI/TCP on the same address.
func TestPreferFallbackOverRoCE(t *testing.T) {
	const port = 24792
	idev, err := roce.Open("127.0.0.9", roce.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer idev.Close()
	node := func(ip string, opts iscsitarget.Options, iserOn bool) string {
		srv := newTargetServer(t, scsitarget.LUConfig{}, nil, opts)
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(fabric.TCP(l))
		d, err := roce.Open(ip, roce.Options{Port: port})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		if iserOn {
			rl, err := d.Listen(l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(fabric.ISER(rl, d.RDMA().AllocPD(), iser.Options{}))
		}
		return l.Addr().String()
	}
	endNode := node("127.0.0.6", iscsitarget.Options{EndNode: true}, true)
	gateway := node("127.0.0.7", iscsitarget.Options{Gateway: true}, true)
	tcpOnly := node("127.0.0.8", iscsitarget.Options{}, false)
	for _, tc := range []preferCase{
		{"direct to an end node", endNode, "direct", true, iser.PreferEndNode, ""},
		{"direct to a gateway", gateway, "direct", true, iser.PreferGateway, "rejected: iSER: this node is a gateway; an end node only was asked"},
		{"gateway to an end node", endNode, "gateway", true, iser.PreferEndNode, "rejected: iSER: this node is an end node; a gateway only was asked"},
		{"direct without iSER", tcpOnly, "direct", false, 0, "reason 8"},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, idev, "roce") })
	}
}
