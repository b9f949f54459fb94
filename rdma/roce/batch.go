package roce

// Datagram batching: the transport builds its packets in
// batches — everything one hold of a queue pair's lock produced, such as
// the 32 packets of a 128 KiB RDMA Read response (RC.unlock) — and the
// device sends a batch with one sendmmsg(2). A run of equal-sized packets
// goes out as one UDP GSO datagram (UDP_SEGMENT): the kernel cuts it into
// the packets where the path needs them, and on loopback or a veth hands
// it to the receiver whole. On receive, recvmmsg(2) reads several
// datagrams per system call, and a datagram that holds several packets is
// split again.
//
// The ICRC covers the IPv4 identification. Linux writes 0 in a DF
// datagram of an unconnected socket, and its segmentation numbers the
// segments of a GSO datagram on from there: segment k carries k (Linux's
// inet_gso_segment; TestGSOOverVeth checks it on the running kernel,
// across a veth that segments). So segment k's ICRC is
// computed over identification k, a receiver that gets the segments (a
// kernel rxe, a real NIC) checks each over its real header, and ours,
// getting the datagram whole, checks segment k over the header
// segmentation gives it — or, for a fixed-identification sender's
// datagrams merged by GRO, over their common identification (two
// candidate headers instead of one, only for datagrams that arrive merged).

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/blockwire/blockwire/internal/spin"
	"github.com/blockwire/blockwire/rdma/ib"
	"golang.org/x/sys/unix"
)

const (
	maxGSOSegs  = 64    // Linux's UDP_MAX_SEGMENTS (newer kernels take 128)
	maxGSOBytes = 65000 // a UDP payload stays under 65507
	txMsgs      = 32    // messages per sendmmsg
	rxMsgs      = 8     // datagrams per recvmmsg
	rxBufLen    = 65536 // a whole IPv4 datagram
)

// txBatch is one sendmmsg call's worth of messages and what they point
// at; pooled per device, so a warm device allocates nothing to send.
type txBatch struct {
	d     *Device
	msgs  [txMsgs]unix.Mmsghdr
	first [txMsgs]int  // each message's first packet (of the packets given)
	gso   [txMsgs]bool // the message is a GSO datagram
	oob   [txMsgs][32]byte
	// Up to three iovecs per packet: the packet (or its headers), its
	// payload when held apart, then its pad and ICRC (tail).
	iovs  []unix.Iovec
	tails [][8]byte
	sa4   unix.RawSockaddrInet4
	sa6   unix.RawSockaddrInet6
	// The sendmmsg call of flush, made once: a closure per call would
	// allocate.
	call         func(fd uintptr) bool
	off, cnt     int
	sent         int
	errno        syscall.Errno
	gsoCmsgLen   int
	gsoCmsgSpace int
	icrc         ib.ICRCBuf
}

func (d *Device) newTxBatch() *txBatch {
	tb := &txBatch{d: d, gsoCmsgLen: unix.CmsgLen(2), gsoCmsgSpace: unix.CmsgSpace(2)}
	tb.call = func(fd uintptr) bool {
		tb.sent, tb.errno = sendmmsg(fd, tb.msgs[tb.off:tb.cnt])
		return true
	}
	return tb
}

// sendmmsg sends msgs on fd, a socket in blocking mode, and returns how
// many were sent.
//
// It asks first without waiting (MSG_DONTWAIT), through RawSyscall6, which
// does not tell Go's scheduler of a system call: such a call holds its P
// (processor) throughout, and the scheduler neither hands that P to
// another thread when the call passes 20 µs (sysmon's retake, which a
// sendmmsg on loopback passes: it runs the receiver's side too) nor parks
// a thread for it afterwards. Receiving is done the same way (rxBatch).
// Measured (docs/bench/journal.md): iSER over RoCE, 128 KiB writes at QD 8
// +10–24 %, 4 KiB reads at QD 32 +24 %; either call alone changed nothing.
// Only when the socket cannot take the first message now (EAGAIN) does it
// wait, in a system call the scheduler knows of, so a full socket never
// holds a P.
func sendmmsg(fd uintptr, msgs []unix.Mmsghdr) (int, syscall.Errno) {
	p, n := uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs))
	r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, p, n, unix.MSG_DONTWAIT, 0, 0)
	if e == unix.EAGAIN || e == unix.EINTR {
		r, _, e = unix.Syscall6(unix.SYS_SENDMMSG, fd, p, n, 0, 0, 0)
		for e == unix.EINTR {
			r, _, e = unix.Syscall6(unix.SYS_SENDMMSG, fd, p, n, 0, 0, 0)
		}
	}
	return int(r), e
}

// sendBatch sends pkts (transport packets, BTH through pad) to peer in
// order, each with its ICRC: as few system calls as sendmmsg allows, runs
// of equal-sized packets as GSO datagrams unless the kernel refused one.
// mtu is the queue pair's path MTU (group); 0 for packets of none (the
// CM's MADs), each its own datagram. ext, when not nil, holds payloads
// apart (VecLink): a packet whose ext[i] is not nil is its headers in
// pkts[i], the payload ext[i] and a pad added here, and the kernel copies
// the payload straight from where it lies — the one copy it makes.
func (d *Device) sendBatch(peer netip.Addr, mtu int, pkts, ext [][]byte) {
	tb, _ := d.txPool.Get().(*txBatch)
	if tb == nil {
		tb = d.newTxBatch()
	}
	if cap(tb.iovs) < 3*len(pkts) {
		tb.iovs = make([]unix.Iovec, 3*len(pkts))
		tb.tails = make([][8]byte, len(pkts))
	}
	tb.iovs, tb.tails = tb.iovs[:3*len(pkts)], tb.tails[:len(pkts)]
	var name *byte
	var namelen uint32
	if peer.Is4() {
		tb.sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: peer.As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&tb.sa4.Port))[:], uint16(d.port))
		name, namelen = (*byte)(unsafe.Pointer(&tb.sa4)), unix.SizeofSockaddrInet4
	} else {
		tb.sa6 = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: peer.As16()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&tb.sa6.Port))[:], uint16(d.port))
		name, namelen = (*byte)(unsafe.Pointer(&tb.sa6)), unix.SizeofSockaddrInet6
	}
	for i := 0; i < len(pkts); {
		nm := 0
		for nm < txMsgs && i < len(pkts) {
			j := d.group(pkts, ext, i, mtu)
			m := &tb.msgs[nm]
			*m = unix.Mmsghdr{}
			m.Hdr.Name, m.Hdr.Namelen = name, namelen
			iov := tb.iovs[3*i : 3*i]
			for k := i; k < j; k++ {
				n := pktLen(pkts, ext, k) + ib.ICRCLen
				ip := ipHeader(d.ip, peer, 8+n)
				ip.setID(uint16(k - i))
				udp := udpHeader(d.txPort, d.port, 8+n)
				tail := tb.tails[k][:]
				var crc uint32
				if ext != nil && ext[k] != nil {
					pad := tail[:-len(ext[k])&3]
					clear(pad)
					crc = tb.icrc.SumParts(ip.bytes(), udp[:], pkts[k], ext[k], pad)
					tail = tail[:len(pad)+ib.ICRCLen]
				} else {
					crc = tb.icrc.Sum(ip.bytes(), udp[:], pkts[k])
					tail = tail[:ib.ICRCLen]
				}
				binary.LittleEndian.PutUint32(tail[len(tail)-ib.ICRCLen:], crc)
				iov = appendIov(iov, pkts[k])
				if ext != nil && ext[k] != nil {
					iov = appendIov(iov, ext[k])
				}
				iov = appendIov(iov, tail)
			}
			m.Hdr.Iov = &iov[0]
			m.Hdr.SetIovlen(len(iov))
			tb.first[nm], tb.gso[nm] = i, j-i > 1
			if j-i > 1 {
				c := tb.oob[nm][:tb.gsoCmsgSpace]
				clear(c)
				h := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
				h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
				h.SetLen(tb.gsoCmsgLen)
				*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])) = uint16(pktLen(pkts, ext, i) + ib.ICRCLen)
				m.Hdr.Control = &c[0]
				m.Hdr.SetControllen(len(c))
			}
			nm++
			i = j
		}
		if redo := tb.flush(nm); redo >= 0 {
			i = redo // GSO refused: the rest again, one datagram per packet
		}
	}
	d.txPool.Put(tb)
}

// appendIov adds an iovec for b (not empty) to iov, whose array has room.
func appendIov(iov []unix.Iovec, b []byte) []unix.Iovec {
	v := unix.Iovec{Base: unsafe.SliceData(b)}
	v.SetLen(len(b))
	return append(iov, v)
}

// pktLen is the length of packet k, BTH through pad, its payload held
// apart or not (sendBatch).
func pktLen(pkts, ext [][]byte, k int) int {
	if ext == nil || ext[k] == nil {
		return len(pkts[k])
	}
	return len(pkts[k]) + len(ext[k]) + -len(ext[k])&3
}

// group returns the end of the run starting at pkts[i] that one datagram
// carries: up to maxGSOSegs packets of the first one's size, the last
// possibly shorter (what UDP_SEGMENT takes), within maxGSOBytes. A run
// starts only at a packet with a whole path MTU of payload, so that a
// receiver that gets the datagram whole knows where to cut it
// (Device.segmentSize).
func (d *Device) group(pkts, ext [][]byte, i, mtu int) int {
	if d.noGSO.Load() || i+1 == len(pkts) {
		return i + 1
	}
	seg := pktLen(pkts, ext, i)
	if hl, ok := ib.HeaderLen(ib.Opcode(pkts[i][0])); !ok || seg != hl+mtu {
		return i + 1
	}
	total := seg + ib.ICRCLen
	j := i + 1
	for j < len(pkts) && j-i < maxGSOSegs {
		l := pktLen(pkts, ext, j)
		if l > seg || total+l+ib.ICRCLen > maxGSOBytes {
			break
		}
		total += l + ib.ICRCLen
		j++
		if l < seg {
			break
		}
	}
	return j
}

// flush sends the first nm messages. A datagram the kernel cannot take is
// lost like any other (the transport retransmits) — except a GSO datagram
// refused for being GSO: then GSO is switched off for the device and
// flush returns the first packet to send again (else -1).
func (tb *txBatch) flush(nm int) int {
	d := tb.d
	for tb.off, tb.cnt = 0, nm; tb.off < tb.cnt; {
		tb.sent, tb.errno = 0, 0
		if err := d.txRaw.Write(tb.call); err != nil {
			return -1 // closed
		}
		if tb.errno == 0 {
			for _, g := range tb.gso[tb.off : tb.off+tb.sent] {
				if g {
					d.counts.gsoSent.Add(1)
				}
			}
			tb.off += tb.sent
			continue
		}
		// The message at tb.off failed.
		if tb.gso[tb.off] && gsoRefused(tb.errno) {
			if !d.noGSO.Swap(true) {
				d.log.Info("roce: the kernel refused a UDP GSO datagram; sending one datagram per packet", "err", tb.errno)
			}
			return tb.first[tb.off]
		}
		tb.off++
	}
	return -1
}

// gsoRefused tells the errors of a kernel or route that cannot send a
// UDP_SEGMENT datagram (no checksum offload, an old kernel, a path MTU
// below the segment) from a datagram merely lost.
func gsoRefused(e syscall.Errno) bool {
	return e == unix.EIO || e == unix.EINVAL || e == unix.EOPNOTSUPP || e == unix.ENOPROTOOPT
}

// ---- receive ----

// rxBatch holds recvmmsg's buffers; one per receiving goroutine.
type rxBatch struct {
	bufs [rxMsgs][]byte
	iovs [rxMsgs]unix.Iovec
	msgs [rxMsgs]unix.Mmsghdr
	oob  [rxMsgs][64]byte
	from [rxMsgs]unix.RawSockaddrInet6
	n    int
	call func(fd uintptr) bool
	// read polls the socket within spin before it sleeps (polled counts
	// the reads that found datagrams while polling).
	spin   spin.Budget
	empty  bool
	slept  bool // this read's wait slept in Go's poller (spin said not to poll again)
	polled *atomic.Uint64
}

func newRxBatch(control bool, poll time.Duration, polled *atomic.Uint64) *rxBatch {
	rb := &rxBatch{spin: spin.New(poll), polled: polled}
	for i := range rb.bufs {
		rb.bufs[i] = make([]byte, rxBufLen)
	}
	rb.call = func(fd uintptr) bool {
		for i := range rb.msgs {
			rb.iovs[i] = unix.Iovec{Base: &rb.bufs[i][0]}
			rb.iovs[i].SetLen(rxBufLen)
			rb.msgs[i] = unix.Mmsghdr{}
			rb.msgs[i].Hdr.Iov = &rb.iovs[i]
			rb.msgs[i].Hdr.SetIovlen(1)
			rb.msgs[i].Hdr.Name = (*byte)(unsafe.Pointer(&rb.from[i]))
			rb.msgs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
			if control {
				rb.msgs[i].Hdr.Control = &rb.oob[i][0]
				rb.msgs[i].Hdr.SetControllen(len(rb.oob[i]))
			}
		}
		// Never waits (MSG_DONTWAIT): a RawSyscall6, for the reason
		// sendmmsg gives.
		r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&rb.msgs[0])), rxMsgs, unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EAGAIN {
			rb.empty = rb.spin.Again()
			rb.slept = rb.slept || !rb.empty
			return rb.empty // false: Read waits for the socket
		}
		rb.n = int(r)
		if e != 0 {
			rb.n = 0
		}
		return true
	}
	return rb
}

// read waits for datagrams and reads as many as are queued (up to
// rxMsgs); msg(i) is the i-th. With spin, it polls the socket without
// blocking, yielding to the process's other goroutines between tries,
// until spin has passed, before it sleeps in Go's poller: what lands
// meanwhile is read without a wake-up.
func (rb *rxBatch) read(c syscall.RawConn) error {
	rb.spin.Start()
	rb.slept = false
	for {
		rb.n, rb.empty = 0, false
		if err := c.Read(rb.call); err != nil || !rb.empty {
			if err == nil && rb.spin.Polled() {
				rb.polled.Add(1)
			}
			if err == nil && rb.slept {
				rb.spin.Woke() // the next waits poll as long as this one took, within spin
			}
			return err
		}
		runtime.Gosched()
	}
}

func (rb *rxBatch) msg(i int) []byte { return rb.bufs[i][:rb.msgs[i].Len] }

// source is the sender of datagram i (a UDP socket's recvmmsg).
func (rb *rxBatch) source(i int) (netip.AddrPort, bool) {
	sa := &rb.from[i]
	switch sa.Family {
	case unix.AF_INET:
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		p := (*[2]byte)(unsafe.Pointer(&s4.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), binary.BigEndian.Uint16(p[:])), true
	case unix.AF_INET6:
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), binary.BigEndian.Uint16(p[:])), true
	}
	return netip.AddrPort{}, false
}

// groSize is the segment size a UDP_GRO socket reported for datagram i
// (0: one packet).
func (rb *rxBatch) groSize(i int) int {
	c := rb.oob[i][:rb.msgs[i].Hdr.Controllen]
	for len(c) >= unix.CmsgLen(0) {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
		l := int(h.Len)
		if l < unix.CmsgLen(0) || l > len(c) {
			return 0
		}
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && l >= unix.CmsgLen(4) {
			return int(*(*int32)(unsafe.Pointer(&c[unix.CmsgLen(0)])))
		}
		c = c[min(len(c), unix.CmsgSpace(l-unix.CmsgLen(0))):]
	}
	return 0
}
