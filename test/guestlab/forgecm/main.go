// Command forgecm asks a RoCEv2 device for an iSER connection (RDMA/CM
// port space, the iSER CM header) with an RDMA/CM header that claims a
// source address of its choosing, from its own real address, and says
// what came back:
//
//	REP  the request was accepted (forgecm then completes the handshake
//	     with an RTU and holds the connection a moment, so the target
//	     sees it established under the claimed address)
//	REJ  the request was refused (the reason and its text)
//
// Exit status 0 on either answer, 1 on none. The guest lab runs it
// against blockwire on the kernel's rxe to see which address a kernel
// RDMA device reports for such a peer (verbs-rxe-forged-cm).
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/rdma/ib"
	"github.com/blockwire/blockwire/rdma/roce/rocetest"
)

func main() {
	from := flag.String("from", "", "our address (the device answers here)")
	to := flag.String("to", "", "the device's address")
	udp := flag.Int("udp", 4791, "the RoCEv2 UDP port")
	port := flag.Int("port", 3260, "the RDMA/CM port asked for")
	claim := flag.String("claim", "", "the source address the RDMA/CM header claims (default: -from)")
	hold := flag.Duration("hold", 3*time.Second, "after an RTU, how long to keep the connection")
	flag.Parse()
	if err := run(*from, *to, *udp, *port, *claim, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "forgecm:", err)
		os.Exit(1)
	}
}

func run(from, to string, udp, port int, claim string, hold time.Duration) error {
	if claim == "" {
		claim = from
	}
	f, err := netip.ParseAddr(from)
	if err != nil {
		return err
	}
	t, err := netip.ParseAddr(to)
	if err != nil {
		return err
	}
	c, err := netip.ParseAddr(claim)
	if err != nil {
		return err
	}
	p, err := rocetest.Dial(f, netip.AddrPortFrom(t, uint16(udp)))
	if err != nil {
		return err
	}
	defer p.Close()
	req, err := p.REQ(uint16(port), c, iser.CMHeader{ZBVANotSupported: true}.Append(nil))
	if err != nil {
		return err
	}
	if err := p.SendREQ(req); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		m, err := p.Recv(time.Until(deadline))
		if err != nil {
			return fmt.Errorf("no answer to the REQ claiming %s: %w", c, err)
		}
		switch m.AttrID {
		case ib.AttrMRA:
			continue // the target needs time
		case ib.AttrREJ:
			rej := ib.DecodeREJ(&m.Data)
			fmt.Printf("forgecm: REJ reason %d %q (claimed %s from %s)\n", rej.Reason, rej.ARI[:rej.ARILength], c, f)
			return nil
		case ib.AttrREP:
			rep := ib.DecodeREP(&m.Data)
			fmt.Printf("forgecm: REP (claimed %s from %s)\n", c, f)
			var rtu [ib.CMDataLen]byte
			ib.PutCommIDs(&rtu, ib.CommIDs{Local: req.LocalCommID, Remote: rep.LocalCommID}, nil)
			if err := p.Send(ib.AttrRTU, m.TID, &rtu); err != nil {
				return err
			}
			time.Sleep(hold)
			return nil
		}
	}
	return fmt.Errorf("no answer to the REQ claiming %s", c)
}
