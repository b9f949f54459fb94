package srptarget_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/roce"
	"github.com/blockwire/blockwire/scsitarget"
	"github.com/blockwire/blockwire/srp"
	"github.com/blockwire/blockwire/srp/srpinitiator"
	"github.com/blockwire/blockwire/srp/srptarget"
)

// SRP over the InfiniBand CM the way the SRP InfiniBand annex describes it, on our
// software RoCEv2 device: the initiator connects to the I/O controller's
// service ID with the whole 64-byte SRP_LOGIN_REQ in the REQ (§A.2), one
// channel per initiator port, and once the controller has no channel
// left the next host gets REJ reason 1, no QP available (§A.4), with the
// SRP_LOGIN_REJ still readable. The RDMA/CM form (Linux ib_srp's, 56 bytes
// after the RDMA/CM header) works on the same target.
func TestSRPOverInfiniBandCM(t *testing.T) {
	const port = 14792 // UDP, apart from rdma/roce's tests
	td, err := roce.Open("127.0.0.4", roce.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	id, err := roce.Open("127.0.0.5", roce.Options{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer id.Close()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	dev := scsitarget.NewDevice("iqn.2026-11.org.blockwire:srpt-ib", log)
	m, _ := mem.New(16 << 20)
	lu, err := scsitarget.NewLU(dev.Name(), scsitarget.LUConfig{Backend: m})
	if err != nil {
		t.Fatal(err)
	}
	dev.AddLU(lu)
	srv := srptarget.New(srptarget.Options{PD: td.RDMA().AllocPD(), Device: dev, IDExt: idExt, IOCGUID: idExt,
		MaxChannels: 2, Logger: log})
	defer srv.Close()
	native, err := td.ListenService(idExt)
	if err != nil {
		t.Fatal(err)
	}
	viaCM, err := td.Listen("127.0.0.4:5555")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(native)
	go srv.Serve(viaCM)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func(ext uint64, sid uint64, addr string) (*srpinitiator.Device, error) {
		return srpinitiator.Open(ctx, "srp://"+addr+"/0011223344556677/0", srpinitiator.Options{Fabric: id, PD: id.RDMA().AllocPD(),
			ServiceID: sid, Initiator: srp.MakePortID(ext, 0x0002c90300b10c6b)})
	}
	a, err := open(1, idExt, "127.0.0.4:1")
	if err != nil {
		t.Fatalf("login to the I/O controller's service ID: %v", err)
	}
	defer a.Close()
	checkGood(t, a)
	b, err := open(2, 0, "127.0.0.4:5555")
	if err != nil {
		t.Fatalf("login through RDMA/CM's port space: %v", err)
	}
	defer b.Close()
	checkGood(t, b)
	if n := srv.Channels(); n != 2 {
		t.Fatalf("%d channels, want 2", n)
	}

	// Past the limit: our initiator reports the SRP_LOGIN_REJ...
	_, err = open(3, idExt, "127.0.0.4:1")
	var lrj *srp.LoginRej
	if !errors.As(err, &lrj) || lrj.Reason != srp.RejectChannelLimit {
		t.Fatalf("a login past the channel limit: %v", err)
	}
	// ...which arrived in a REJ with reason 1, no QP available.
	var rj *rdma.RejectError
	cp := rdma.ConnParams{PD: id.RDMA().AllocPD(), QP: rdma.QPConfig{SendCQ: rdma.NewCQ(4), RecvCQ: rdma.NewCQ(4)},
		ServiceIDBase: idExt &^ 0xffff, PrivateData: (&srp.LoginReq{MaxITIULen: 8260, BufFormats: srp.BufDirect,
			Initiator: srp.MakePortID(4, 0x0002c90300b10c6b), Target: tgtPort}).Append(nil)}
	_, _, err = id.Dial(ctx, "127.0.0.4:26231", cp) // 0x6677: the service ID's low 16 bits
	if !errors.As(err, &rj) || rj.Reason != rdma.RejectNoQP {
		t.Fatalf("a login past the channel limit: %v; want REJ reason 1 (no QP available)", err)
	}
	var rej srp.LoginRej
	if err := rej.Decode(rj.PrivateData); err != nil || rej.Reason != srp.RejectChannelLimit {
		t.Fatalf("the REJ's private data: %v %v; want SRP_LOGIN_REJ with the channel limit reason", err, rej.Reason)
	}
	if string(rj.ARI) != "SRP channel limit reached" {
		t.Fatalf("ARI %q", rj.ARI)
	}
}
