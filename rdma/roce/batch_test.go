package roce

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/servetest"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/ib"
	"golang.org/x/sys/unix"
)

// qpPair is a connected queue qpPair between two devices: a dials b, and b
// has a registered region for a's RDMA Writes and Reads.
type qpPair struct {
	a, b   *Device
	ea, eb *end
	qa, qb rdma.QP
	region []byte
	mr     *rdma.MR
}

func connect(t *testing.T, a, b *Device, port int) *qpPair {
	t.Helper()
	p := &qpPair{a: a, b: b, ea: newEnd(a), eb: newEnd(b), region: make([]byte, 1<<20)}
	p.ea.scq, p.eb.rcq = rdma.NewCQ(256), rdma.NewCQ(256)
	var err error
	if p.mr, err = p.eb.pd.Register(p.region, 0x10000, rdma.RemoteRead|rdma.RemoteWrite); err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(b.ip, uint16(port)).String()
	ln, err := b.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acc := make(chan rdma.QP, 1)
	go func() {
		defer close(acc)
		r, err := ln.Accept(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		q, err := r.Accept(p.eb.params(nil))
		if err != nil {
			t.Error(err)
			return
		}
		acc <- q
	}()
	if p.qa, _, err = a.Dial(ctx, addr, p.ea.params(nil)); err != nil {
		t.Fatal(err)
	}
	if p.qb = <-acc; p.qb == nil {
		t.FailNow()
	}
	return p
}

// exercise moves rounds of 128 KiB RDMA Writes (a gather list of three
// pieces), Reads back and Sends of several MTUs through the qpPair, eight at
// a time, and checks every byte.
func (p *qpPair) exercise(t *testing.T, rounds int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	const size = 128 << 10
	sinks := make([][]byte, 8)
	mrs := make([]*rdma.MR, 8)
	for i := range sinks {
		sinks[i] = make([]byte, size)
		mrs[i], _ = p.ea.pd.Register(sinks[i], 0, rdma.LocalWrite)
	}
	for r := range rounds {
		// The receive for this round's Send is posted first: b's
		// queue pair lock then orders the checks of the round before
		// (this goroutine) before this round's Writes into b's memory
		// (b's receiver, under that lock) — the race detector cannot
		// see the order the UDP socket gives them.
		buf := make([]byte, 5*p.a.mtu+44)
		if err := p.qb.PostRecv(rdma.RecvWR{ID: 7, Buf: buf}); err != nil {
			t.Fatal(err)
		}
		want := make([][]byte, 8)
		for i := range want {
			want[i] = make([]byte, size)
			for j := range want[i] {
				want[i][j] = byte(rng.Uint32())
			}
			w := want[i]
			to := 0x10000 + uint64(i*size)
			if err := p.qa.PostSend(&rdma.SendWR{ID: uint64(i), Op: rdma.OpWrite, SG: [][]byte{w[:1000], w[1000:70000], w[70000:]}, RemoteSTag: p.mr.STag(), RemoteTO: to}); err != nil {
				t.Fatal(err)
			}
			if err := p.qa.PostSend(&rdma.SendWR{ID: 100 + uint64(i), Op: rdma.OpRead, Sink: mrs[i], Length: size, RemoteSTag: p.mr.STag(), RemoteTO: to}); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range waitN(t, p.ea.scq, 16) {
			if c.Status != rdma.Success {
				t.Fatalf("round %d: %+v", r, c)
			}
		}
		// A Send of 5 MTUs and a bit; b looks at its memory after its
		// receive completion, ordered after the Writes' placement.
		msg := want[r%8][:len(buf)]
		if err := p.qa.PostSend(&rdma.SendWR{ID: 9, Op: rdma.OpSend, SG: [][]byte{msg}}); err != nil {
			t.Fatal(err)
		}
		if c := waitN(t, p.eb.rcq, 1)[0]; c.Status != rdma.Success || !bytes.Equal(buf[:c.Len], msg) {
			t.Fatalf("round %d: Send arrived as %+v", r, c)
		}
		waitN(t, p.ea.scq, 1)
		for i := range want {
			if !bytes.Equal(p.region[i*size:(i+1)*size], want[i]) {
				t.Fatalf("round %d: RDMA Write %d landed wrong", r, i)
			}
			if !bytes.Equal(sinks[i], want[i]) {
				t.Fatalf("round %d: RDMA Read %d brought the wrong bytes", r, i)
			}
		}
	}
}

func (d *Device) stats() string {
	return fmt.Sprintf("GSO datagrams sent %d, datagrams split %d, bad ICRCs %d, batches found polling %d", d.counts.gsoSent.Load(), d.counts.split.Load(), d.counts.badICRC.Load(), d.counts.polled.Load())
}

// Runs of whole-MTU packets leave as UDP GSO datagrams, reach the peer
// whole on loopback and are cut there — read from the raw socket (root),
// or from the UDP socket with UDP_GRO (the segment size in a control
// message) — and every packet's ICRC is checked; with GSO off
// (Options.NoGSO, --roce-gso=false) one datagram per packet, as before.
// No ICRC fails.
func TestBatchedTransfers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		udpOnly bool
		noGSO   bool
		poll    time.Duration
	}{{"raw socket", false, false, 0}, {"UDP socket", true, false, 0}, {"no GSO", false, true, 0},
		{"polling, raw socket", false, false, 50 * time.Millisecond}, {"polling, UDP socket", true, false, 50 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.udpOnly && os.Geteuid() != 0 {
				t.Skip("the raw-socket receive path needs root")
			}
			a, err := Open("127.0.0.1", Options{Port: 14791, udpOnly: tc.udpOnly, NoGSO: tc.noGSO, Poll: tc.poll})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := Open("127.0.0.2", Options{Port: 14791, udpOnly: tc.udpOnly, NoGSO: tc.noGSO, Poll: tc.poll})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			p := connect(t, a, b, 3260)
			p.exercise(t, 6)
			t.Logf("initiator: %s; responder: %s", a.stats(), b.stats())
			sent, split := a.counts.gsoSent.Load()+b.counts.gsoSent.Load(), a.counts.split.Load()+b.counts.split.Load()
			if tc.noGSO && (sent != 0 || split != 0) {
				t.Fatalf("GSO off, yet %d GSO datagrams were sent and %d split", sent, split)
			}
			if !tc.noGSO && (b.counts.gsoSent.Load() == 0 || a.counts.gsoSent.Load() == 0 || a.counts.split.Load() == 0 || b.counts.split.Load() == 0) {
				t.Fatal("128 KiB Writes and Read responses went out without GSO, or arrived uncut")
			}
			if bad := a.counts.badICRC.Load() + b.counts.badICRC.Load(); bad != 0 {
				t.Fatalf("%d packets failed their ICRC", bad)
			}
			if polled := a.counts.polled.Load() + b.counts.polled.Load(); (tc.poll > 0) != (polled > 0) {
				t.Fatalf("polling %v, yet %d receive batches were found while polling", tc.poll, polled)
			}
		})
	}
}

// A kernel that refuses a UDP GSO datagram (here: a socket told to send
// no UDP checksums, which Linux's GSO does not allow) gets each packet
// again as a datagram of its own, and GSO stays off for the device.
func TestGSORefusedFallsBack(t *testing.T) {
	a, b := devices(t)
	if err := a.txRaw.Control(func(fd uintptr) {
		if err := syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_NO_CHECK, 1); err != nil {
			t.Fatal(err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	p := connect(t, a, b, 3261)
	p.exercise(t, 2)
	if !a.noGSO.Load() || a.counts.gsoSent.Load() != 0 {
		t.Fatalf("GSO refused, but the device still has it on (%s)", a.stats())
	}
	if b.noGSO.Load() || b.counts.gsoSent.Load() == 0 {
		t.Fatalf("the other device lost GSO too (%s)", b.stats())
	}
}

// A datagram that holds several packets is cut and each segment checked
// on its own, over the IP header segmentation gives it (identification
// id+k, or id for a fixed-identification sender merged by GRO): a
// segment whose ICRC does not match is dropped alone — here the middle
// one of a three-packet Send, after which the responder asks for it again
// (a PSN sequence NAK) and its receive holds only the first packet's
// bytes. The segment size is reported (UDP_GRO) or found from the first
// packet (the raw socket).
func TestCoalescedSegmentsCheckedAlone(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ids     [3]uint16 // the identification each segment's ICRC covers
		corrupt int       // the segment sent with a flipped payload bit (-1: none)
		placed  int       // packets that land
	}{
		{"consecutive identifications", [3]uint16{0, 1, 2}, -1, 3},
		{"fixed identification (GRO)", [3]uint16{0, 0, 0}, -1, 3},
		{"a wrong identification", [3]uint16{0, 2, 2}, -1, 1},
		{"a corrupt middle segment", [3]uint16{0, 1, 2}, 1, 1},
	} {
		for _, reported := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/size reported=%v", tc.name, reported), func(t *testing.T) {
				d, err := Open("127.0.0.1", Options{Port: 14791})
				if err != nil {
					t.Fatal(err)
				}
				defer d.Close()
				const mtu = 1024
				pd := d.RDMA().AllocPD()
				rcq := rdma.NewCQ(4)
				var sent [][]byte
				l := linkFunc(func(b []byte) { sent = append(sent, append([]byte(nil), b...)) })
				q := NewRC(RCConfig{QPConfig: rdma.QPConfig{RecvCQ: rcq}, PD: pd, LocalQPN: 0x99, RemoteQPN: 0x77, MTU: mtu}, l)
				defer q.Close()
				buf := make([]byte, 3*mtu)
				if err := q.PostRecv(rdma.RecvWR{ID: 5, Buf: buf}); err != nil {
					t.Fatal(err)
				}
				d.mu.Lock()
				d.qps[0x99] = q
				d.mu.Unlock()
				peer := netip.MustParseAddr("127.0.0.9")
				var dgram []byte
				for k, op := range []ib.Opcode{ib.RCSendFirst, ib.RCSendMiddle, ib.RCSendLast} {
					pk := ib.Packet{BTH: ib.BTH{Opcode: op, PKey: 0xffff, DestQP: 0x99, PSN: uint32(k), AckReq: k == 2},
						Payload: bytes.Repeat([]byte{byte('a' + k)}, mtu)}
					b, _ := pk.Append(nil)
					ip := ipHeader(peer, d.ip, 8+len(b)+ib.ICRCLen)
					ip.setID(tc.ids[k])
					udp := udpHeader(d.port, d.port, 8+len(b)+ib.ICRCLen)
					b = ib.AppendICRC(ip.bytes(), udp[:], b)
					if k == tc.corrupt {
						b[len(b)-100] ^= 1
					}
					dgram = append(dgram, b...)
				}
				// As a GSO datagram arrives whole: one header,
				// identification 0, the whole length.
				ip := ipHeader(peer, d.ip, 8+len(dgram))
				udp := udpHeader(d.port, d.port, 8+len(dgram))
				gso := 0
				if reported {
					gso = len(dgram) / 3
				}
				var h held
				d.datagram(peer, &ip, udp[:], dgram, gso, &h)
				h.flush()
				for k := range 3 {
					landed := bytes.Equal(buf[k*mtu:(k+1)*mtu], bytes.Repeat([]byte{byte('a' + k)}, mtu))
					if landed != (k < tc.placed) {
						t.Fatalf("packet %d landed: %v, want %v (%s)", k, landed, k < tc.placed, d.stats())
					}
				}
				var c [1]rdma.Completion
				if n := rcq.Poll(c[:]); (n == 1) != (tc.placed == 3) {
					t.Fatalf("%d receive completions with %d of 3 packets placed", n, tc.placed)
				}
				if len(sent) == 0 {
					t.Fatal("the responder sent nothing")
				}
				last, _ := ib.Decode(append(sent[len(sent)-1], 0, 0, 0, 0))
				want := ib.AETH{Syndrome: ib.SyndromeACK | 0x1f, MSN: 1}
				wantPSN := uint32(2)
				if tc.placed < 3 {
					want, wantPSN = ib.AETH{Syndrome: ib.SyndromeNAK | ib.NAKPSNSequenceError}, 1
				}
				if last.BTH.Opcode != ib.RCAcknowledge || last.AETH != want || last.BTH.PSN != wantPSN {
					t.Fatalf("the responder's answer: %s PSN %d %+v, want PSN %d %+v", last.BTH.Opcode, last.BTH.PSN, last.AETH, wantPSN, want)
				}
			})
		}
	}
}

type linkFunc func([]byte)

func (f linkFunc) Send(b []byte) { f(b) }

// A warm queue qpPair allocates nothing per request: 128 KiB Writes and
// Reads through two devices (GSO out, recvmmsg and cutting in, ICRCs,
// acknowledgements).
func TestNoAllocationsPerOp(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race; .ci/run runs this test without it")
	}
	a, b := devices(t)
	p := connect(t, a, b, 3262)
	const size = 128 << 10
	data := make([]byte, size)
	sinkBuf := make([]byte, size)
	sink, _ := p.ea.pd.Register(sinkBuf, 0, rdma.LocalWrite)
	wr := rdma.SendWR{ID: 2, Op: rdma.OpWrite, SG: [][]byte{data}, RemoteSTag: p.mr.STag(), RemoteTO: 0x10000}
	rd := rdma.SendWR{ID: 3, Op: rdma.OpRead, Sink: sink, Length: size, RemoteSTag: p.mr.STag(), RemoteTO: 0x10000}
	var cs [2]rdma.Completion
	op := func() {
		if err := p.qa.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		if err := p.qa.PostSend(&rd); err != nil {
			t.Fatal(err)
		}
		for n := 0; n < 2; {
			k, err := p.ea.scq.Wait(context.Background(), cs[n:])
			if err != nil {
				t.Fatal(err)
			}
			n += k
		}
	}
	for range 200 {
		op()
	}
	if n := testing.AllocsPerRun(300, op); n > 0.1 {
		t.Fatalf("%.2f allocations per Write and Read", n)
	}
}

// Linux numbers the segments of a GSO datagram it cuts 0, 1, 2, … from
// the identification 0 of a DF datagram — what the sender's ICRCs cover
// (batch.go). Two devices in two network namespaces joined by a veth: one
// whose sender side cuts every GSO datagram (gso_max_segs 1, as a NIC
// without UDP segmentation offload), so the receiver checks each segment
// over the header it really carries; and one that passes it whole (the
// receiver cuts it). Data moves both ways, intact, with no ICRC failure.
func TestGSOOverVeth(t *testing.T) {
	needNetns(t)
	for _, segmented := range []bool{true, false} {
		t.Run(fmt.Sprintf("segmented=%v", segmented), func(t *testing.T) {
			nsA, nsB := fmt.Sprintf("bwgso%da", os.Getpid()), fmt.Sprintf("bwgso%db", os.Getpid())
			ipCmd(t, "netns", "add", nsA)
			t.Cleanup(func() { exec.Command("ip", "netns", "del", nsA).Run() })
			ipCmd(t, "netns", "add", nsB)
			t.Cleanup(func() { exec.Command("ip", "netns", "del", nsB).Run() })
			ipCmd(t, "link", "add", "va", "netns", nsA, "type", "veth", "peer", "name", "vb", "netns", nsB)
			ipCmd(t, "-n", nsA, "addr", "add", "10.201.0.1/24", "dev", "va")
			ipCmd(t, "-n", nsB, "addr", "add", "10.201.0.2/24", "dev", "vb")
			ipCmd(t, "-n", nsA, "link", "set", "va", "up")
			ipCmd(t, "-n", nsB, "link", "set", "vb", "up")
			if segmented {
				ipCmd(t, "-n", nsA, "link", "set", "va", "gso_max_segs", "1")
				ipCmd(t, "-n", nsB, "link", "set", "vb", "gso_max_segs", "1")
			}
			a := openIn(t, nsA, "10.201.0.1")
			b := openIn(t, nsB, "10.201.0.2")
			if a.mtu != 1024 {
				t.Fatalf("path MTU %d on a 1500-byte veth, want 1024", a.mtu)
			}
			p := connect(t, a, b, 3260)
			p.exercise(t, 4)
			t.Logf("A: %s; B: %s", a.stats(), b.stats())
			if a.counts.gsoSent.Load() == 0 || b.counts.gsoSent.Load() == 0 {
				t.Fatal("no GSO datagram was sent")
			}
			split := a.counts.split.Load() + b.counts.split.Load()
			if segmented && split != 0 {
				t.Fatalf("the veth was to cut every GSO datagram, yet %d arrived whole", split)
			}
			if !segmented && split == 0 {
				t.Fatal("no GSO datagram arrived whole over the veth")
			}
			if bad := a.counts.badICRC.Load() + b.counts.badICRC.Load(); bad != 0 {
				t.Fatalf("%d packets failed their ICRC", bad)
			}
		})
	}
}

// Over IPv6 (two addresses on the loopback of a network namespace): the
// GID is the address itself, datagrams arrive on the UDP socket (no raw
// socket for IPv6) with the IPv6 header rebuilt for the ICRC, and GSO
// datagrams arrive whole.
func TestIPv6Transfers(t *testing.T) {
	ns := servetest.Netns(t, "fd00:b::1/128", "fd00:b::2/128")
	a := openIn(t, ns, "fd00:b::1")
	b := openIn(t, ns, "fd00:b::2")
	p := connect(t, a, b, 3260)
	p.exercise(t, 4)
	t.Logf("A: %s; B: %s", a.stats(), b.stats())
	if a.counts.gsoSent.Load() == 0 || b.counts.split.Load() == 0 {
		t.Fatal("no GSO datagram went whole from A to B")
	}
	if bad := a.counts.badICRC.Load() + b.counts.badICRC.Load(); bad != 0 {
		t.Fatalf("%d packets failed their ICRC", bad)
	}
}

// needNetns skips a test that makes network namespaces where it cannot.
func needNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip(8) (apt-get install iproute2)")
	}
}

// ipCmd runs ip(8) with args, failing the test if it fails.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// openIn opens a device on ip inside network namespace ns: its sockets
// are made there, by a thread that joins it for the call.
func openIn(t *testing.T, ns, ip string) *Device {
	t.Helper()
	return openInWith(t, ns, ip, Options{Port: 4791})
}

// openInWith is openIn with the device's options.
func openInWith(t *testing.T, ns, ip string, opt Options) *Device {
	t.Helper()
	var d *Device
	servetest.InNetns(t, ns, func() (err error) { d, err = Open(ip, opt); return err })
	t.Cleanup(func() { d.Close() })
	return d
}

// TestPayloadsSentFromTheirBuffers: the device sends a Write's, a Send's
// and a Read response's payload from the memory it lies in, the kernel's
// copy being the only one (VecLink), and adds the pad itself. Lengths that
// are not a multiple of four (a pad of 1 to 3 bytes), a payload that
// spans gather elements (gathered instead) and one that does not all
// arrive intact, with no ICRC failing.
func TestPayloadsSentFromTheirBuffers(t *testing.T) {
	a, b := devices(t)
	p := connect(t, a, b, 3263)
	if _, ok := p.qa.(*RC); !ok {
		t.Fatalf("%T is not the device's RC queue pair", p.qa)
	}
	if p.qa.(*RC).vec == nil {
		t.Fatal("the device's queue pair does not send payloads from their buffers")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 3, 5, 4097, 2*a.mtu + 3, 3*a.mtu + 2, 64<<10 + 1} {
		want := make([]byte, n)
		for i := range want {
			want[i] = byte(rng.Uint32())
		}
		sinkBuf := make([]byte, n)
		sink, _ := p.ea.pd.Register(sinkBuf, 0, rdma.LocalWrite)
		sg := [][]byte{want}
		if n > 4 {
			sg = [][]byte{want[:n/3], want[n/3:]} // one packet spans the two
		}
		recv := make([]byte, n)
		if err := p.qb.PostRecv(rdma.RecvWR{ID: 1, Buf: recv}); err != nil {
			t.Fatal(err)
		}
		if err := p.qa.PostSend(&rdma.SendWR{ID: 1, Op: rdma.OpWrite, SG: sg, RemoteSTag: p.mr.STag(), RemoteTO: 0x10000}); err != nil {
			t.Fatal(err)
		}
		if err := p.qa.PostSend(&rdma.SendWR{ID: 2, Op: rdma.OpRead, Sink: sink, Length: n, RemoteSTag: p.mr.STag(), RemoteTO: 0x10000}); err != nil {
			t.Fatal(err)
		}
		if err := p.qa.PostSend(&rdma.SendWR{ID: 3, Op: rdma.OpSend, SG: [][]byte{want}}); err != nil {
			t.Fatal(err)
		}
		for _, c := range waitN(t, p.ea.scq, 3) {
			if c.Status != rdma.Success {
				t.Fatalf("%d bytes: %+v", n, c)
			}
		}
		if c := waitN(t, p.eb.rcq, 1)[0]; c.Status != rdma.Success || !bytes.Equal(recv[:c.Len], want) {
			t.Fatalf("%d bytes: the Send arrived as %+v", n, c)
		}
		if !bytes.Equal(sinkBuf, want) {
			t.Fatalf("%d bytes: written then read back differently", n)
		}
		sink.Invalidate()
	}
	if bad := a.counts.badICRC.Load() + b.counts.badICRC.Load(); bad != 0 {
		t.Fatalf("%d packets failed their ICRC", bad)
	}
}

// TestSendWaitsForAFullSocket: sendmmsg asks without waiting first; a
// socket that cannot take the message then is waited for, not skipped
// (the datagram would be lost) and not spun on. A Unix datagram socket
// whose peer does not read fills up as a UDP socket's send buffer can.
func TestSendWaitsForAFullSocket(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	msg := make([]byte, 1024)
	filled := 0
	for ; filled < 100000; filled++ {
		if err := unix.Sendto(fds[0], msg, unix.MSG_DONTWAIT, nil); err == unix.EAGAIN {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if filled == 100000 {
		t.Fatal("the socket never filled")
	}
	iov := unix.Iovec{Base: &msg[0]}
	iov.SetLen(len(msg))
	msgs := []unix.Mmsghdr{{Hdr: unix.Msghdr{Iov: &iov, Iovlen: 1}}}
	type result struct {
		n int
		e syscall.Errno
	}
	done := make(chan result, 1)
	go func() {
		n, e := sendmmsg(uintptr(fds[0]), msgs)
		done <- result{n, e}
	}()
	select {
	case r := <-done:
		t.Fatalf("sendmmsg on a full socket returned at once: %d sent, %v", r.n, r.e)
	case <-time.After(200 * time.Millisecond):
	}
	// The peer reads what was queued: the waiting message goes too.
	buf := make([]byte, 2048)
	got := 0
	deadline := time.Now().Add(5 * time.Second)
	for got <= filled && time.Now().Before(deadline) {
		if _, _, err := unix.Recvfrom(fds[1], buf, unix.MSG_DONTWAIT); err == nil {
			got++
		} else if err == unix.EAGAIN {
			time.Sleep(time.Millisecond)
		} else {
			t.Fatal(err)
		}
	}
	if got != filled+1 {
		t.Fatalf("the peer read %d datagrams, want the %d queued and the one waiting", got, filled+1)
	}
	if r := <-done; r.n != 1 || r.e != 0 {
		t.Fatalf("sendmmsg once there was room: %d sent, %v", r.n, r.e)
	}
}

// The receiver's polling adapts (internal/spin): a datagram that comes
// long after the socket went quiet halves the polling time; one waiting
// when the receiver reads changes nothing.
func TestReceiverPollingAdapts(t *testing.T) {
	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := net.DialUDP("udp4", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	rc, err := rx.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var polled atomic.Uint64
	rb := newRxBatch(false, time.Millisecond, &polled)
	time.AfterFunc(100*time.Millisecond, func() { tx.Write([]byte("late")) })
	if err := rb.read(rc); err != nil || rb.n != 1 {
		t.Fatalf("read %d datagrams: %v", rb.n, err)
	}
	if got := rb.spin.Current(); got != 500*time.Microsecond {
		t.Fatalf("polling after a 100 ms wait: %v, want 500µs", got)
	}
	tx.Write([]byte("waiting"))
	time.Sleep(10 * time.Millisecond)
	if err := rb.read(rc); err != nil || rb.n != 1 {
		t.Fatalf("read %d datagrams: %v", rb.n, err)
	}
	if got := rb.spin.Current(); got != 500*time.Microsecond {
		t.Fatalf("polling after a read that did not wait: %v, want 500µs", got)
	}
}
