package initiator_test

import (
	"context"
	"fmt"
	"net"

	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/iscsi/iscsitarget"
	"github.com/blockwire/blockwire/scsitarget"
)

// exampleTarget serves a 16 MiB in-memory LUN on a loopback port and
// returns the portal; a real program would point at any iSCSI target.
func exampleTarget() (string, func()) {
	const name = "iqn.2026-11.org.blockwire:example"
	dev := scsitarget.NewDevice(name, nil)
	be, _ := mem.New(16 << 20)
	lu, _ := scsitarget.NewLU(name, scsitarget.LUConfig{Backend: be})
	dev.AddLU(lu)
	srv := iscsitarget.NewServer(nil, iscsitarget.Options{})
	srv.AddTarget(&iscsitarget.Target{Name: name, Device: dev})
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(fabric.TCP(l))
	return l.Addr().String(), func() { srv.Shutdown(context.Background()) }
}

func ExampleDiscover() {
	portal, stop := exampleTarget()
	defer stop()
	targets, err := initiator.Discover(context.Background(), portal, initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, t := range targets {
		fmt.Println(t.Name)
	}
	// Output: iqn.2026-11.org.blockwire:example
}

func ExampleOpen() {
	portal, stop := exampleTarget()
	defer stop()
	ctx := context.Background()
	dev, err := initiator.Open(ctx, "iscsi://"+portal+"/iqn.2026-11.org.blockwire:example/0", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	block := make([]byte, dev.BlockSize())
	copy(block, "hello, block storage")
	if _, err := dev.WriteAt(block, 4096); err != nil {
		fmt.Println(err)
		return
	}
	back := make([]byte, len(block))
	if _, err := dev.ReadAt(back, 4096); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(dev.Size(), string(back[:20]))
	// Output: 16777216 hello, block storage
}

func ExampleSession_Do() {
	portal, stop := exampleTarget()
	defer stop()
	ctx := context.Background()
	s, err := initiator.Login(ctx, portal, "iqn.2026-11.org.blockwire:example", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	inq := make([]byte, 36)
	for range 2 { // the first command reports the power-on unit attention
		if _, err = s.Do(ctx, 0, []byte{0x12, 0, 0, 0, 36, 0}, nil, inq); err == nil {
			break
		}
	}
	fmt.Printf("%s %s\n", inq[8:16], inq[16:25])
	// Output: BLOCKWIR blockwire
}
