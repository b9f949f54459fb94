package roce

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/blockwire/blockwire/internal/persource"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/ib"
	"golang.org/x/sys/unix"
)

// Device is a software RoCEv2 device on one IPv4 or IPv6 address (its GID
// the IPv4-mapped address or the IPv6 address itself): every queue
// pair's packets go through one UDP socket on the RoCEv2 port, demultiplexed
// by destination QP; QP 1 carries the Communication Manager's MADs. It
// implements rdma.Fabric with the RDMA/CM conventions Linux uses: service ID
// 0x0000000001060000 + port, and a 36-byte IP header at the start of a
// REQ's private data.
//
// The invariant CRC covers the IPv4 header's identification field. Sent
// datagrams carry DF on an unconnected socket, for which Linux writes
// identification 0, so the CRC can be computed before sending. Received
// ones are read with their IP header from a raw socket when the process
// may open one (a kernel rxe numbers its datagrams); otherwise they are
// checked assuming the sender did as this device does.
type Device struct {
	log   *slog.Logger
	rdev  *rdma.Device
	ip    netip.Addr
	port  int
	conn  *net.UDPConn
	guid  uint64
	mtu   int
	close sync.Once
	done  chan struct{}

	mu        sync.Mutex
	qps       map[uint32]*RC
	nextQPN   uint32
	listeners map[uint16]*listener    // by port, in both port spaces
	services  map[uint64]*listener    // by whole service ID
	dials     map[uint32]chan cmReply // by our communication ID
	accepts   map[uint32]*connRequest // REQs answered with a REP, awaiting RTU
	waitRTU   map[uint32]*connRequest // the same, by our QPN: a first packet stands for a lost RTU
	conns     map[uint32]*connection  // established, by our communication ID
	// seen holds the REQs being handled, by the peer's (comm ID, QPN), to
	// answer a repeated REQ as before; bounded (Options.MaxConnRequests)
	// and forgotten once the connection is established or its request
	// failed, or ConnRequestTTL after it came — so spoofed REQs cannot
	// grow it, and a later REQ that reuses the IDs is not answered with a
	// stale REP or REJ.
	seen      map[[2]uint32]*connRequest
	seenFrom  persource.Counts[netip.Addr] // seen's requests by source (sources.OfIP of the peer)
	lastSweep time.Time
	maxReqs   int
	maxFrom   int
	sources   persource.Sources
	reqTTL    time.Duration
	// txPool holds sendmmsg batches (*txBatch): no lock is held across
	// the socket write, and a warm pool allocates nothing. Every packet
	// leaves through sendBatch, the CM's too.
	txPool sync.Pool
	raw    syscall.RawConn // the UDP socket's
	tx     *os.File        // the sending socket (openTx)
	txRaw  syscall.RawConn
	txPort int
	poll   time.Duration // Options.Poll
	dropIn func() bool   // Options.dropIn (tests)
	noGSO  atomic.Bool   // the kernel refused a UDP GSO datagram
	counts counts
}

// counts are what the batching did, for tests and the curious.
type counts struct {
	gsoSent atomic.Uint64 // GSO datagrams sent
	split   atomic.Uint64 // datagrams received whole and cut into packets
	badICRC atomic.Uint64 // packets dropped for their ICRC
	polled  atomic.Uint64 // receive batches found while polling (Options.Poll)
	// REQs rejected for the bounds on connection requests (BoundsHit).
	reqsRefused persource.Refusals
}

type connection struct {
	qp        *RC
	local     uint32
	remote    uint32
	remoteQPN uint32
	peer      netip.Addr
}

type cmReply struct {
	rep *ib.REP
	rej *ib.REJ
	mra *ib.MRA
}

// Options configure a Device.
type Options struct {
	// Port is the UDP port (default ib.UDPPort, 4791; tests on one host
	// give each device its own loopback address instead).
	Port int
	MTU  int // path MTU payload: 256 … 4096; default from the interface's MTU, as rxe does
	// MaxConnRequests bounds the connection requests remembered at once
	// (1024); beyond it a REQ is rejected (reason 1, no QP available).
	// ConnRequestTTL is how long one is remembered at most (30 s: the
	// active side's retries and an MRA's service timeout fit in it).
	MaxConnRequests int
	ConnRequestTTL  time.Duration
	// MaxConnRequestsPerSource bounds those of one IP address (128), so
	// that a host sending REQs it never completes cannot take them all;
	// Sources says what one address is (an IPv6 peer's network, if
	// asked).
	MaxConnRequestsPerSource int
	Sources                  persource.Sources
	Logger                   *slog.Logger
	// NoGSO sends one datagram per packet (batch.go sends runs of them
	// as UDP GSO datagrams): a packet capture on the host then shows each
	// packet — it sees a GSO datagram before the kernel cuts it — and a
	// NIC whose segmentation offload numbered IP identifications other
	// than Linux does could not break the ICRCs.
	NoGSO bool
	// Poll has the receiving goroutine poll its socket this long after
	// finding it empty before it sleeps (0: it sleeps at once): what
	// lands meanwhile is read without a wake-up, for the CPU the polling
	// takes while traffic flows.
	Poll time.Duration

	udpOnly bool // tests: no raw socket, as when not root
	// dropIn, in tests, drops the received datagrams it reports true for
	// (the lossy network of TestDeviceOverLossyNetwork).
	dropIn func() bool
}

// Open starts a device on ip (an IPv4 or IPv6 address of this host).
func Open(ip string, opt Options) (*Device, error) {
	addr, err := netip.ParseAddr(strings.Trim(ip, "[]"))
	if err != nil || addr.Zone() != "" {
		return nil, fmt.Errorf("roce: %q is not an IP address", ip)
	}
	addr = addr.Unmap()
	network := "udp4"
	if addr.Is6() {
		// RoCEv2 GID = the IPv6 address itself (IPv4's is ::ffff:a.b.c.d).
		network = "udp6"
	}
	if opt.Port == 0 {
		opt.Port = ib.UDPPort
	}
	if opt.MTU == 0 {
		opt.MTU = pathMTU(addr)
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.MaxConnRequests <= 0 {
		opt.MaxConnRequests = 1024
	}
	if opt.MaxConnRequestsPerSource <= 0 {
		opt.MaxConnRequestsPerSource = 128
	}
	if opt.ConnRequestTTL <= 0 {
		opt.ConnRequestTTL = 30 * time.Second
	}
	c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, uint16(opt.Port))))
	if err != nil {
		return nil, fmt.Errorf("roce: %w", err)
	}
	raw, err := c.SyscallConn()
	if err == nil {
		raw.Control(func(fd uintptr) {
			// DF, so Linux writes IP identification 0 (see Device);
			// IPv6 routers never fragment.
			if addr.Is4() {
				err = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_MTU_DISCOVER, syscall.IP_PMTUDISC_DO)
			} else {
				// A kernel rxe sends UDP checksum 0 over IPv6 too (the
				// ICRC protects the packet), which IPv6 sockets drop
				// unless told to take it (RFC 6936).
				err = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_UDP, udpNoCheck6RX, 1)
			}
			// A GSO datagram (batch.go) is queued whole, with its
			// segment size, not cut up on the way in. Kernels before
			// 5.0 have no UDP_GRO and cut it (then only the raw socket
			// path, which sees it whole, checks its segments).
			syscall.SetsockoptInt(int(fd), syscall.IPPROTO_UDP, unix.UDP_GRO, 1)
			// A burst of MTU packets must not overflow the socket: ask
			// for 8 MiB past rmem_max when allowed (root), else what the
			// system gives.
			for _, o := range [][2]int{{syscall.SO_RCVBUFFORCE, syscall.SO_RCVBUF}, {syscall.SO_SNDBUFFORCE, syscall.SO_SNDBUF}} {
				if syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, o[0], 8<<20) != nil {
					syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, o[1], 8<<20)
				}
			}
		})
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("roce: %w", err)
	}
	if raw == nil {
		c.Close()
		return nil, errors.New("roce: the UDP socket has no file descriptor")
	}
	var g [8]byte
	rand.Read(g[:])
	d := &Device{log: opt.Logger, rdev: rdma.NewDevice("roce " + ip), ip: addr, port: opt.Port, conn: c,
		guid: binary.BigEndian.Uint64(g[:]), mtu: opt.MTU, done: make(chan struct{}), qps: map[uint32]*RC{}, nextQPN: 0x20,
		listeners: map[uint16]*listener{}, services: map[uint64]*listener{}, dials: map[uint32]chan cmReply{}, accepts: map[uint32]*connRequest{}, waitRTU: map[uint32]*connRequest{},
		conns: map[uint32]*connection{}, seen: map[[2]uint32]*connRequest{}, maxReqs: opt.MaxConnRequests, maxFrom: opt.MaxConnRequestsPerSource, sources: opt.Sources, reqTTL: opt.ConnRequestTTL, raw: raw}
	d.noGSO.Store(opt.NoGSO)
	d.poll = opt.Poll
	d.dropIn = opt.dropIn
	if d.tx, d.txPort, err = openTx(addr); err == nil {
		d.txRaw, err = d.tx.SyscallConn()
	}
	if err != nil {
		c.Close()
		if d.tx != nil {
			d.tx.Close()
		}
		return nil, fmt.Errorf("roce: %w", err)
	}
	// Opened before Open returns, so no datagram sent after it is missed.
	var rawSock *os.File
	if addr.Is4() && !opt.udpOnly {
		if rawSock, err = openRaw(addr, opt.Port); err != nil {
			rawSock = nil
		} else {
			// The raw socket reads everything for us: the UDP socket,
			// kept for its port, drops what it gets before queueing it.
			raw.Control(func(fd uintptr) {
				drop := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
				unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: 1, Filter: &drop[0]})
			})
		}
	}
	go d.receive(rawSock)
	return d, nil
}

// RDMA is the device's memory registration namespace: allocate protection
// domains from it.
func (d *Device) RDMA() *rdma.Device { return d.rdev }

// Close stops the device; its queue pairs fail.
func (d *Device) Close() error {
	d.close.Do(func() {
		close(d.done)
		d.conn.Close()
		d.tx.Close()
		d.mu.Lock()
		qps := make([]*RC, 0, len(d.qps))
		for _, q := range d.qps {
			qps = append(qps, q)
		}
		d.mu.Unlock()
		for _, q := range qps {
			q.Close()
		}
	})
	return nil
}

// ipHeader is the IPv4 header Linux puts on our datagrams, as far as the
// ICRC sees it (the fields it masks are left zero).
//
// An IPv6 header has nothing the sender varies but what the ICRC masks
// (traffic class, flow label, hop limit), so it is rebuilt exactly from
// the addresses and the length.
func ipHeader(src, dst netip.Addr, udpLen int) ipHdr {
	var h ipHdr
	if !src.Is4() {
		h.n = 40
		h.b[0] = 0x60
		binary.BigEndian.PutUint16(h.b[4:], uint16(udpLen))
		h.b[6] = 17
		s, t := src.As16(), dst.As16()
		copy(h.b[8:], s[:])
		copy(h.b[24:], t[:])
		return h
	}
	h.n = 20
	h.b[0] = 0x45
	binary.BigEndian.PutUint16(h.b[2:], uint16(20+udpLen))
	h.b[6] = 0x40 // DF, identification 0
	h.b[9] = 17
	s, t := src.As4(), dst.As4()
	copy(h.b[12:], s[:])
	copy(h.b[16:], t[:])
	return h
}

// udpNoCheck6RX is Linux's UDP_NO_CHECK6_RX socket option.
const udpNoCheck6RX = 102

// ipHdr is an IPv4 (20 to 60 bytes) or IPv6 (40-byte) header.
type ipHdr struct {
	b [60]byte
	n int
}

func (h *ipHdr) bytes() []byte { return h.b[:h.n] }

func (h *ipHdr) is4() bool { return h.b[0]>>4 == 4 }

// id and setID are the IPv4 identification (IPv6 has none).
func (h *ipHdr) id() uint16 {
	if !h.is4() {
		return 0
	}
	return binary.BigEndian.Uint16(h.b[4:])
}

func (h *ipHdr) setID(id uint16) {
	if h.is4() {
		binary.BigEndian.PutUint16(h.b[4:], id)
	}
}

// setUDPLen sets the length fields for a UDP datagram of udpLen bytes.
func (h *ipHdr) setUDPLen(udpLen int) {
	if h.is4() {
		binary.BigEndian.PutUint16(h.b[2:], uint16(h.n+udpLen))
	} else {
		binary.BigEndian.PutUint16(h.b[4:], uint16(udpLen))
	}
}

func udpHeader(sport, dport, length int) [8]byte {
	var u [8]byte
	binary.BigEndian.PutUint16(u[0:], uint16(sport))
	binary.BigEndian.PutUint16(u[2:], uint16(dport))
	binary.BigEndian.PutUint16(u[4:], uint16(length))
	return u
}

func (d *Device) receive(raw *os.File) {
	if raw != nil {
		d.receiveRaw(raw)
		return
	}
	// Without a raw socket (not root) the IP header is rebuilt on the
	// assumption that the sender set DF and Linux wrote identification 0
	// — true of this device, not of a kernel rxe.
	rb := newRxBatch(true, d.poll, &d.counts.polled)
	var h held
	for {
		h.flush()
		if err := rb.read(d.raw); err != nil {
			return // closed
		}
		for i := range rb.n {
			from, ok := rb.source(i)
			if !ok {
				continue
			}
			b := rb.msg(i)
			src := from.Addr()
			ip := ipHeader(src, d.ip, 8+len(b))
			udp := udpHeader(int(from.Port()), d.port, 8+len(b))
			d.datagram(src, &ip, udp[:], b, rb.groSize(i), &h)
		}
	}
}

// openTx opens the socket datagrams are sent from: a UDP socket of its
// own, bound to ip and a port the kernel picks (RoCEv2 leaves the source
// port to the sender, Linux rxe varies it by queue pair), in blocking
// mode so that it stays out of Go's network poller. The socket that
// receives is registered there for writing too, and Linux wakes an epoll
// waiter each time a sent datagram's buffer is freed (sock_wfree): on
// loopback that was a wake-up of this process's poller per datagram.
func openTx(ip netip.Addr) (*os.File, int, error) {
	family := syscall.AF_INET
	if ip.Is6() {
		family = syscall.AF_INET6
	}
	fd, err := syscall.Socket(family, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, syscall.IPPROTO_UDP)
	if err != nil {
		return nil, 0, err
	}
	var sa syscall.Sockaddr
	if ip.Is4() {
		sa = &syscall.SockaddrInet4{Addr: ip.As4()}
	} else {
		sa = &syscall.SockaddrInet6{Addr: ip.As16()}
	}
	if err = syscall.Bind(fd, sa); err == nil && ip.Is4() {
		// DF, so Linux writes IP identification 0 (see Device).
		err = syscall.SetsockoptInt(fd, syscall.IPPROTO_IP, syscall.IP_MTU_DISCOVER, syscall.IP_PMTUDISC_DO)
	}
	if err != nil {
		syscall.Close(fd)
		return nil, 0, err
	}
	if syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, 8<<20) != nil {
		syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, 8<<20)
	}
	bound, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return nil, 0, err
	}
	port := 0
	switch a := bound.(type) {
	case *syscall.SockaddrInet4:
		port = a.Port
	case *syscall.SockaddrInet6:
		port = a.Port
	}
	return os.NewFile(uintptr(fd), "roce-tx"), port, nil
}

// openRaw opens a raw IPv4 socket that receives the UDP datagrams for
// ip:port with their IP header, so the ICRC is checked over the header the
// sender really sent (a kernel rxe numbers its datagrams). A socket filter
// keeps every other UDP datagram of the host out of it. Needs CAP_NET_RAW.
func openRaw(ip netip.Addr, port int) (*os.File, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, syscall.IPPROTO_UDP)
	if err != nil {
		return nil, err
	}
	a := ip.As4()
	// Classic BPF over the IPv4 header: protocol UDP, destination ip,
	// UDP destination port (after a header of IHL words).
	f := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 9},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 17, Jf: 6},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 16},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: binary.BigEndian.Uint32(a[:]), Jf: 4},
		{Code: unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH, K: 0},
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_IND, K: 2},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: uint32(port), Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: 1 << 18},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]}); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	// Datagrams that arrived between socket() and the filter.
	var junk [1]byte
	for {
		if _, _, err := syscall.Recvfrom(fd, junk[:], syscall.MSG_DONTWAIT); err != nil {
			break
		}
	}
	syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, 8<<20)
	return os.NewFile(uintptr(fd), "roce-raw"), nil
}

// receiveRaw reads whole IPv4 datagrams and keeps those for this device.
// The UDP socket stays bound (no port-unreachable answers) but unread.
func (d *Device) receiveRaw(f *os.File) {
	go func() {
		<-d.done
		f.Close()
	}()
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	me := d.ip.As4()
	rb := newRxBatch(false, d.poll, &d.counts.polled)
	var h held
	for {
		h.flush()
		if err := rb.read(rc); err != nil {
			return // closed
		}
		for i := range rb.n {
			b := rb.msg(i)
			n := len(b)
			if n < 28 || b[0]>>4 != 4 || b[9] != 17 {
				continue
			}
			ihl := int(b[0]&0x0f) * 4
			if ihl < 20 || n < ihl+8 || [4]byte(b[16:20]) != me || int(binary.BigEndian.Uint16(b[ihl+2:])) != d.port {
				continue
			}
			ulen := int(binary.BigEndian.Uint16(b[ihl+4:]))
			if ulen < 8 || ihl+ulen > n {
				continue
			}
			var ip ipHdr
			ip.n = copy(ip.b[:], b[:ihl])
			src := netip.AddrFrom4([4]byte(b[12:16]))
			d.datagram(src, &ip, b[ihl:ihl+8], b[ihl+8:ihl+ulen], 0, &h)
		}
	}
}

// datagram takes one received UDP datagram: ip and udp its headers as sent
// (or rebuilt), pkt its payload, gso the segment size the socket reported
// for a datagram that arrived coalesced (0: none, or not known). A GSO
// datagram delivered whole holds several packets (batch.go): it is cut at
// the segment size — reported, or that of the first packet when it is
// longer than one packet of its queue pair can be — and segment k is
// checked over the IP header segmentation gives it: identification id+k
// (or id, a fixed-identification sender's datagrams merged by GRO), its
// own lengths.
func (d *Device) datagram(src netip.Addr, ip *ipHdr, udp, pkt []byte, gso int, h *held) {
	if d.dropIn != nil && d.dropIn() {
		return
	}
	guessed := false
	if gso <= 0 {
		gso, guessed = d.segmentSize(pkt), true
	}
	if gso <= 0 || len(pkt) <= gso {
		d.input(src, ip.bytes(), udp, pkt, h)
		return
	}
	id0 := ip.id()
	var u [8]byte
	copy(u[:], udp)
	for k, off := 0, 0; off < len(pkt); k, off = k+1, off+gso {
		seg := pkt[off:min(off+gso, len(pkt))]
		if len(seg) < ib.BTHLen+ib.ICRCLen {
			return
		}
		ip.setUDPLen(8 + len(seg))
		binary.BigEndian.PutUint16(u[4:], uint16(8+len(seg)))
		want := binary.LittleEndian.Uint32(seg[len(seg)-ib.ICRCLen:])
		body := seg[:len(seg)-ib.ICRCLen]
		ip.setID(id0 + uint16(k))
		ok := h.icrc.Sum(ip.bytes(), u[:], body) == want
		if !ok && k > 0 && ip.is4() {
			ip.setID(id0)
			ok = h.icrc.Sum(ip.bytes(), u[:], body) == want
		}
		if !ok && k == 0 && guessed {
			// Not cut where guessed (a peer whose MTU is larger than
			// ours): checked as one packet, as before.
			ip.setID(id0)
			ip.setUDPLen(8 + len(pkt))
			d.input(src, ip.bytes(), udp, pkt, h)
			return
		}
		if !ok {
			d.counts.badICRC.Add(1)
			continue
		}
		if k == 0 {
			d.counts.split.Add(1)
		}
		d.deliver(src, seg, h)
	}
}

// segmentSize is the length of a whole-MTU packet like pkt's first one
// when pkt is longer than one packet of its queue pair can be, else 0.
// (The sender makes a GSO datagram only of runs that start with such a
// packet: batch.go.)
func (d *Device) segmentSize(pkt []byte) int {
	if len(pkt) <= 256+ib.BTHLen+ib.ICRCLen {
		return 0
	}
	qpn := binary.BigEndian.Uint32(pkt[4:]) & 0xffffff
	if qpn == 1 {
		return 0
	}
	hl, ok := ib.HeaderLen(ib.Opcode(pkt[0]))
	if !ok {
		return 0
	}
	d.mu.Lock()
	q := d.qps[qpn]
	d.mu.Unlock()
	if q == nil {
		return 0
	}
	if n := hl + q.cfg.MTU + ib.ICRCLen; len(pkt) > n {
		return n
	}
	return 0
}

// input checks a packet's ICRC and hands it to QP 1 (the CM) or to the
// queue pair it names.
func (d *Device) input(src netip.Addr, ip, udp, pkt []byte, h *held) {
	n := len(pkt)
	if n < ib.BTHLen+ib.ICRCLen {
		return
	}
	if h.icrc.Sum(ip, udp, pkt[:n-ib.ICRCLen]) != binary.LittleEndian.Uint32(pkt[n-ib.ICRCLen:]) {
		d.counts.badICRC.Add(1)
		return // a bad ICRC: silently dropped, as the transport rules say
	}
	d.deliver(src, pkt, h)
}

// deliver hands a packet whose ICRC was checked to QP 1 (the CM) or to
// the queue pair it names, holding back what it makes the queue pair
// send until h.flush.
func (d *Device) deliver(src netip.Addr, pkt []byte, h *held) {
	qpn := binary.BigEndian.Uint32(pkt[4:]) & 0xffffff
	if qpn == 1 {
		d.cm(src, pkt)
		return
	}
	d.mu.Lock()
	q := d.qps[qpn]
	r := d.waitRTU[qpn]
	delete(d.waitRTU, qpn)
	d.mu.Unlock()
	if r != nil {
		r.established()
	}
	if q != nil {
		q.inputHeld(pkt)
		h.add(q)
	}
}

// held is what a receiving goroutine keeps across one receive batch: the
// queue pairs that received packets and have not sent what those made
// them build, and room for checking ICRCs.
type held struct {
	qps  []*RC
	icrc ib.ICRCBuf
}

func (h *held) add(q *RC) {
	if n := len(h.qps); n == 0 || h.qps[n-1] != q {
		h.qps = append(h.qps, q)
	}
}

// flush sends each queue pair's packets (a queue pair listed twice sends
// nothing the second time).
//
// It yields first: a completion the batch pushed readied a consumer
// (iSER's serve or dispatch) on this processor, behind this goroutine,
// and the other processor seldom takes it over. Running it first starts
// the next step of its I/O now, not after the sendmmsg below; what it
// posts leaves with the held acknowledgements; and another processor
// may pick up this goroutine meanwhile.
func (h *held) flush() {
	if len(h.qps) > 0 {
		runtime.Gosched()
	}
	for i, q := range h.qps {
		q.flushOut()
		h.qps[i] = nil
	}
	h.qps = h.qps[:0]
}

// ---- connection management ----

const (
	cmTimeout = 200 * time.Millisecond
	cmRetries = 10
	cmaHdrLen = 36
)

// link is an RC queue pair's way out.
type link struct {
	d    *Device
	peer netip.Addr
	mtu  int // the queue pair's path MTU
}

// Send sends one packet (RC.unlock sends batches; Link asks for this).
func (l link) Send(pkt []byte) { l.d.sendBatch(l.peer, l.mtu, [][]byte{pkt}, nil) }

// SendBatch sends the packets in order, batched (batch.go).
func (l link) SendBatch(pkts [][]byte) { l.d.sendBatch(l.peer, l.mtu, pkts, nil) }

// SendVec sends the packets in order, batched, the payloads held apart
// copied by the kernel alone (VecLink).
func (l link) SendVec(pkts, ext [][]byte) { l.d.sendBatch(l.peer, l.mtu, pkts, ext) }

func (d *Device) sendMAD(peer netip.Addr, attr uint16, tid uint64, data *[ib.CMDataLen]byte) {
	m := ib.MAD{BaseVersion: 1, MgmtClass: ib.MgmtClassCM, ClassVersion: ib.CMClassVersion, Method: ib.MethodSend, TID: tid, AttrID: attr, Data: *data}
	p := ib.Packet{BTH: ib.BTH{Opcode: ib.UDSendOnly, PKey: 0xffff, DestQP: 1}, DETH: ib.DETH{QKey: ib.GSIQKey, SrcQP: 1}, Payload: m.Append(nil)}
	b, _ := p.Append(nil)
	d.sendBatch(peer, 0, [][]byte{b}, nil)
}

func randU32() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:])
}

func (d *Device) newQP(cfg RCConfig, peer netip.Addr) *RC {
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.qps[d.nextQPN] != nil || d.nextQPN < 2 {
		d.nextQPN = (d.nextQPN + 1) & psnMask
	}
	cfg.LocalQPN = d.nextQPN
	d.nextQPN = (d.nextQPN + 1) & psnMask
	q := NewRC(cfg, link{d, peer, cfg.MTU})
	d.qps[cfg.LocalQPN] = q
	q.onClose = func() { d.disconnect(q) } // called with q.mu held
	return q
}

// disconnect follows a local Close: DREQ to the peer (not waiting for
// its DREP), and the QP leaves the device.
func (d *Device) disconnect(q *RC) {
	d.mu.Lock()
	delete(d.qps, q.cfg.LocalQPN)
	var c *connection
	for id, x := range d.conns {
		if x.qp == q {
			c = x
			delete(d.conns, id)
		}
	}
	d.mu.Unlock()
	if c == nil {
		return
	}
	dreq := ib.DREQ{CommIDs: ib.CommIDs{Local: c.local, Remote: c.remote}, RemoteQPN: c.remoteQPN}
	var data [ib.CMDataLen]byte
	dreq.Encode(&data)
	d.sendMAD(c.peer, ib.AttrDREQ, uint64(c.local), &data)
}

func (d *Device) dropQP(q *RC) {
	d.mu.Lock()
	delete(d.qps, q.cfg.LocalQPN)
	d.mu.Unlock()
}

// cmaHeader is the RDMA/CM IP header Linux puts before a REQ's private
// data (facts: version 0, IP version in the high nibble of byte 1, the
// source port, then source and destination addresses, IPv4 in the last
// four bytes of each).
func cmaHeader(src, dst netip.Addr, sport uint16) [cmaHdrLen]byte {
	var h [cmaHdrLen]byte
	binary.BigEndian.PutUint16(h[2:], sport)
	if src.Is4() {
		h[1] = 0x40
		s, t := src.As4(), dst.As4()
		copy(h[16:20], s[:])
		copy(h[32:36], t[:])
		return h
	}
	h[1] = 0x60
	s, t := src.As16(), dst.As16()
	copy(h[4:20], s[:])
	copy(h[20:36], t[:])
	return h
}

func gid(a netip.Addr) [16]byte { return netip.AddrFrom16(a.As16()).As16() }

// Dial implements rdma.Fabric: addr is "ip:port" of a listener.
func (d *Device) Dial(ctx context.Context, addr string, p rdma.ConnParams) (rdma.QP, []byte, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("roce: %w", err)
	}
	peer := ap.Addr().Unmap()
	if peer.Is4() != d.ip.Is4() {
		return nil, nil, fmt.Errorf("roce: %s and this device's %s are of different IP versions", peer, d.ip)
	}
	base := p.ServiceIDBase
	if base == 0 {
		base = ib.ServiceIDBaseRDMCM
	}
	if base&0xffff != 0 {
		return nil, nil, fmt.Errorf("roce: service ID base %#016x has low bits for the port set", base)
	}
	room := ib.REQPrivateDataLength
	if base == ib.ServiceIDBaseRDMCM {
		room -= cmaHdrLen
	}
	if len(p.PrivateData) > room {
		return nil, nil, fmt.Errorf("roce: %d bytes of private data, a REQ holds %d here", len(p.PrivateData), room)
	}
	p.QP.Defaults()
	local := randU32()
	// A CM message's Starting PSN is the PSN its sender will receive
	// first: Linux's ib_cm sets the active side's receive PSN and the
	// passive side's send PSN from the REQ's, and the reverse from the
	// REP's (shared/captures/iser-rxe.pcap: the target's first Send
	// carries the REQ's PSN, the initiator's the REP's). Our send PSN is
	// known once the REP arrives.
	cfg := RCConfig{QPConfig: p.QP, PD: p.PD, RecvPSN: randU32() & psnMask, MTU: d.mtu,
		Timeout: serviceTime(localACKTimeout), RetryCount: 7, RNRRetryCount: 7,
		LocalAddr: net.UDPAddrFromAddrPort(netip.AddrPortFrom(d.ip, uint16(d.port))), RemoteAddr: net.UDPAddrFromAddrPort(ap)}
	q := d.newQP(cfg, peer)
	for _, r := range p.Recvs {
		q.PostRecv(r)
	}
	req := ib.REQ{LocalCommID: local, ServiceID: ib.ServiceID(base, ap.Port()), LocalCAGUID: d.guid,
		LocalQPN: q.cfg.LocalQPN, ResponderResources: uint8(p.QP.IRD), InitiatorDepth: uint8(p.QP.ORD),
		RemoteCMResponseTimeout: 20, StartingPSN: q.cfg.RecvPSN, LocalCMResponseTimeout: 20, RetryCount: 7,
		PKey: 0xffff, PathMTU: mtuCode(d.mtu), RNRRetryCount: 7, MaxCMRetries: 15}
	req.Primary = ib.Path{LocalLID: 0xffff, RemoteLID: 0xffff, LocalGID: gid(d.ip), RemoteGID: gid(peer), HopLimit: 64, LocalACKTimeout: localACKTimeout}
	if base == ib.ServiceIDBaseRDMCM {
		h := cmaHeader(d.ip, peer, uint16(d.port))
		copy(req.PrivateData[:], h[:])
		copy(req.PrivateData[cmaHdrLen:], p.PrivateData)
	} else {
		copy(req.PrivateData[:], p.PrivateData)
	}
	var data [ib.CMDataLen]byte
	req.Encode(&data)
	reply := make(chan cmReply, 1)
	d.mu.Lock()
	d.dials[local] = reply
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.dials, local)
		d.mu.Unlock()
	}()
	tid := uint64(local)
	fail := func(err error) (rdma.QP, []byte, error) {
		d.dropQP(q)
		q.Close()
		return nil, nil, err
	}
	wait, mraed := cmTimeout, false
	for try := 0; ; try++ {
		if try == cmRetries {
			return fail(errors.New("roce: no answer to the connection request"))
		}
		if !mraed {
			d.sendMAD(peer, ib.AttrREQ, tid, &data)
		}
		mraed = false
		select {
		case r := <-reply:
			if r.mra != nil {
				// An MRA: the REQ arrived; wait the service timeout
				// it announces before asking again (IBA 12.6.6).
				wait, mraed, try = cmTimeout+serviceTime(r.mra.ServiceTimeout), true, try-1
				continue
			}
			if r.rej != nil {
				return fail(&rdma.RejectError{Reason: int(r.rej.Reason), PrivateData: append([]byte(nil), r.rej.PrivateData[:]...),
					ARI: append([]byte(nil), r.rej.ARI[:min(int(r.rej.ARILength), len(r.rej.ARI))]...)})
			}
			rep := r.rep
			q.mu.Lock()
			q.cfg.RemoteQPN = rep.LocalQPN
			q.startSendLocked(rep.StartingPSN)
			q.cfg.ORD = min(q.cfg.ORD, int(rep.ResponderResources))
			q.cfg.IRD = min(q.cfg.IRD, int(rep.InitiatorDepth))
			if rep.RNRRetryCount > 0 { // the passive side's wish for our RNR retries
				q.cfg.RNRRetryCount = int(rep.RNRRetryCount)
			}
			q.mu.Unlock()
			var rtu [ib.CMDataLen]byte
			ib.PutCommIDs(&rtu, ib.CommIDs{Local: local, Remote: rep.LocalCommID}, nil)
			d.sendMAD(peer, ib.AttrRTU, tid, &rtu)
			d.mu.Lock()
			d.conns[local] = &connection{qp: q, local: local, remote: rep.LocalCommID, remoteQPN: rep.LocalQPN, peer: peer}
			d.mu.Unlock()
			return q, append([]byte(nil), rep.PrivateData[:]...), nil
		case <-time.After(wait):
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-d.done:
			return fail(rdma.ErrClosed)
		}
	}
}

// pathMTU is the largest InfiniBand MTU whose packets, with every header
// RoCEv2 adds (IPv6 40, UDP 8, BTH 12, RETH 16, ICRC 4, pad 3), fit the
// MTU of the interface whose network holds addr — what rxe derives from
// its netdev (1024 on a 1500-byte Ethernet, 4096 on loopback, where
// 127.0.0.2 is as local as 127.0.0.1); 1024 when none does. Both ends of
// a link compute the same; a REQ's path MTU is the dialer's, and the
// listener takes the smaller of it and its own.
func pathMTU(addr netip.Addr) int {
	const overhead = 40 + 8 + ib.BTHLen + 16 + ib.ICRCLen + 3
	ifs, err := net.Interfaces()
	if err != nil {
		return 1024
	}
	for _, ifi := range ifs {
		as, _ := ifi.Addrs()
		for _, a := range as {
			if p, err := netip.ParsePrefix(a.String()); err != nil || !p.Masked().Contains(addr) {
				continue
			}
			m := 4096
			for m > 256 && m+overhead > ifi.MTU {
				m /= 2
			}
			return m
		}
	}
	return 1024
}

func mtuCode(mtu int) uint8 {
	for c, m := uint8(1), 256; m <= 4096; c, m = c+1, m*2 {
		if m >= mtu {
			return c
		}
	}
	return 5
}

// cm handles a MAD to QP 1.
func (d *Device) cm(peer netip.Addr, pkt []byte) {
	p, err := ib.Decode(pkt)
	if err != nil || p.BTH.Opcode != ib.UDSendOnly || p.DETH.QKey != ib.GSIQKey {
		return
	}
	m, err := ib.DecodeMAD(p.Payload)
	if err != nil || m.MgmtClass != ib.MgmtClassCM {
		return
	}
	switch m.AttrID {
	case ib.AttrREQ:
		d.gotREQ(peer, &m)
	case ib.AttrREP:
		rep := ib.DecodeREP(&m.Data)
		if d.toDialer(rep.RemoteCommID, cmReply{rep: &rep}) {
			return
		}
		d.mu.Lock()
		c := d.conns[rep.RemoteCommID]
		d.mu.Unlock()
		if c != nil {
			// Our RTU was lost: send it again.
			var rtu [ib.CMDataLen]byte
			ib.PutCommIDs(&rtu, ib.CommIDs{Local: c.local, Remote: c.remote}, nil)
			d.sendMAD(peer, ib.AttrRTU, m.TID, &rtu)
		}
	case ib.AttrMRA:
		// The passive side needs time to answer our REQ.
		if mra := ib.DecodeMRA(&m.Data); mra.MessageMRAed == ib.MsgREQ {
			d.toDialer(mra.Remote, cmReply{mra: &mra})
		}
	case ib.AttrREJ:
		rej := ib.DecodeREJ(&m.Data)
		d.toDialer(rej.RemoteCommID, cmReply{rej: &rej})
	case ib.AttrRTU:
		ids := ib.DecodeCommIDs(&m.Data)
		d.mu.Lock()
		r := d.accepts[ids.Remote]
		delete(d.accepts, ids.Remote)
		if r != nil && r.q != nil {
			delete(d.waitRTU, r.q.cfg.LocalQPN)
		}
		d.mu.Unlock()
		if r != nil {
			r.established()
		}
	case ib.AttrDREQ:
		dreq := ib.DecodeDREQ(&m.Data)
		d.mu.Lock()
		c := d.conns[dreq.Remote]
		delete(d.conns, dreq.Remote)
		d.mu.Unlock()
		var drep [ib.CMDataLen]byte
		ib.PutCommIDs(&drep, ib.CommIDs{Local: dreq.Remote, Remote: dreq.Local}, nil)
		d.sendMAD(peer, ib.AttrDREP, m.TID, &drep)
		if c != nil {
			c.qp.mu.Lock()
			c.qp.onClose = nil // the peer already knows
			c.qp.failLocked(rdma.ErrDisconnected)
			c.qp.unlock() // gives the flushed completions, held or not
			d.dropQP(c.qp)
		}
	}
}

// toDialer hands a REP, REJ or MRA to the Dial waiting under our
// communication ID id; false when none is.
func (d *Device) toDialer(id uint32, r cmReply) bool {
	d.mu.Lock()
	ch := d.dials[id]
	d.mu.Unlock()
	if ch == nil {
		return false
	}
	select {
	case ch <- r:
	default:
	}
	return true
}

func (d *Device) reject(peer netip.Addr, req *ib.REQ, tid uint64, reason uint16, ari string, pd []byte) {
	rej := ib.REJ{LocalCommID: randU32(), RemoteCommID: req.LocalCommID, MessageRejected: ib.MsgREQ, Reason: reason}
	rej.ARILength = uint8(copy(rej.ARI[:], ari))
	copy(rej.PrivateData[:], pd)
	var data [ib.CMDataLen]byte
	rej.Encode(&data)
	d.sendMAD(peer, ib.AttrREJ, tid, &data)
}

func (d *Device) gotREQ(peer netip.Addr, m *ib.MAD) {
	req := ib.DecodeREQ(&m.Data)
	key := [2]uint32{req.LocalCommID, req.LocalQPN}
	d.mu.Lock()
	if r := d.seen[key]; r != nil {
		// A repeated REQ: answer again what we answered.
		d.mu.Unlock()
		r.resend()
		return
	}
	l := d.services[req.ServiceID]
	if l == nil {
		if _, port, ok := ib.ServicePort(req.ServiceID); ok {
			l = d.listeners[port]
		}
	}
	now := time.Now()
	if len(d.seen) >= d.maxReqs || now.Sub(d.lastSweep) > d.reqTTL/4 {
		d.lastSweep = now
		for _, r := range d.seen {
			if now.After(r.expires) {
				d.forgetLocked(r)
			}
		}
	}
	full := len(d.seen) >= d.maxReqs
	src := d.sources.OfIP(peer)
	fromPeer := d.seenFrom.Of(src) >= d.maxFrom
	d.mu.Unlock()
	if l == nil {
		// The iSER-on-InfiniBand draft §II: no iSER service on this port — reason 8.
		d.reject(peer, &req, m.TID, ib.RejInvalidServiceID, "", nil)
		return
	}
	if full {
		d.counts.reqsRefused.Refused(true)
		d.reject(peer, &req, m.TID, ib.RejNoQP, "too many connection requests", nil)
		return
	}
	if fromPeer {
		d.counts.reqsRefused.Refused(false)
		d.reject(peer, &req, m.TID, ib.RejNoQP, "too many connection requests from this address", nil)
		return
	}
	r := &connRequest{d: d, peer: peer, src: src, req: req, tid: m.TID, local: randU32(), ready: make(chan struct{}), key: key, expires: now.Add(d.reqTTL)}
	d.mu.Lock()
	if old := d.seen[key]; old != nil {
		d.forgetLocked(old) // raced in meanwhile: replaced
	}
	d.seen[key] = r
	d.seenFrom.Add(src)
	d.mu.Unlock()
	select {
	case l.reqs <- r:
	default:
		r.RejectReason(ib.RejNoQP, "backlog full", nil)
	}
}

// ---- listening ----

type listener struct {
	d    *Device
	port uint16
	sid  uint64 // ListenService's; 0 for a port
	reqs chan *connRequest
	once sync.Once
	gone chan struct{}
}

// Listen implements rdma.Fabric: addr is "ip:port" with this device's
// address (or none) and the port the service ID carries.
func (d *Device) Listen(addr string) (rdma.Listener, error) {
	_, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("roce: %w", err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port <= 0 || port > 65535 {
		return nil, fmt.Errorf("roce: port %q", ps)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.listeners[uint16(port)] != nil {
		return nil, fmt.Errorf("roce: port %d already has a listener", port)
	}
	l := &listener{d: d, port: uint16(port), reqs: make(chan *connRequest, 64), gone: make(chan struct{})}
	d.listeners[uint16(port)] = l
	return l, nil
}

// ListenService listens for REQs carrying exactly service ID sid, outside
// the port spaces Listen serves — as an InfiniBand I/O controller does for
// SRP (the SRP InfiniBand annex §A.2: the host connects to the service ID the IOC
// registered). Their private data is the consumer's alone.
func (d *Device) ListenService(sid uint64) (rdma.Listener, error) {
	if _, _, ok := ib.ServicePort(sid); ok {
		return nil, fmt.Errorf("roce: service ID %#016x is in a port space; use Listen", sid)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.services[sid] != nil {
		return nil, fmt.Errorf("roce: service ID %#016x already has a listener", sid)
	}
	l := &listener{d: d, sid: sid, reqs: make(chan *connRequest, 64), gone: make(chan struct{})}
	d.services[sid] = l
	return l, nil
}

func (l *listener) Accept(ctx context.Context) (rdma.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.gone:
		return nil, rdma.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *listener) Addr() net.Addr {
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(l.d.ip, l.port))
}

func (l *listener) Close() error {
	l.once.Do(func() {
		l.d.mu.Lock()
		if l.sid != 0 {
			delete(l.d.services, l.sid)
		} else {
			delete(l.d.listeners, l.port)
		}
		l.d.mu.Unlock()
		close(l.gone)
	})
	return nil
}

// connRequest is a REQ handed to the consumer.
type connRequest struct {
	d     *Device
	peer  netip.Addr
	src   netip.Addr // the source peer counts against (Device.seenFrom)
	req   ib.REQ
	tid   uint64
	mu    sync.Mutex
	last  *[ib.CMDataLen]byte // the REP or REJ sent, for a repeated REQ
	attr  uint16
	q     *RC
	local uint32
	ready chan struct{}
	once  sync.Once
	// key is its place in Device.seen, expires when it leaves it at the
	// latest (under Device.mu).
	key     [2]uint32
	expires time.Time
}

// forgetLocked drops r, which Device.seen holds, from it (d.mu held).
func (d *Device) forgetLocked(r *connRequest) {
	delete(d.seen, r.key)
	d.seenFrom.Give(r.src)
}

// forget drops the request from Device.seen now (connection established
// or its REP unanswered), or after a grace period in which a repeated
// REQ still gets the REJ (rejected).
func (r *connRequest) forget(grace time.Duration) {
	d := r.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen[r.key] != r {
		return
	}
	if grace == 0 {
		d.forgetLocked(r)
		return
	}
	if t := time.Now().Add(grace); t.Before(r.expires) {
		r.expires = t
	}
}

// PrivateData implements rdma.ConnRequest: the consumer's part — after
// the RDMA/CM header in the RDMA/CM port space, all of it under another
// base (the iSER-on-InfiniBand draft's iSER base).
func (r *connRequest) PrivateData() []byte {
	if !r.RDMACM() {
		return append([]byte(nil), r.req.PrivateData[:]...)
	}
	return append([]byte(nil), r.req.PrivateData[cmaHdrLen:]...)
}

// RDMACM reports whether the REQ came through RDMA/CM's port space (its
// private data began with the RDMA/CM header) — Linux's ib_srp then sends
// the shorter SRP login form.
func (r *connRequest) RDMACM() bool {
	base, _, ok := ib.ServicePort(r.req.ServiceID)
	return ok && base == ib.ServiceIDBaseRDMCM
}
func (r *connRequest) PeerIRD() int { return int(r.req.ResponderResources) }
func (r *connRequest) PeerORD() int { return int(r.req.InitiatorDepth) }
func (r *connRequest) LocalAddr() net.Addr {
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(r.d.ip, uint16(r.d.port)))
}
func (r *connRequest) RemoteAddr() net.Addr {
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(r.peer, uint16(r.d.port)))
}

func (r *connRequest) resend() {
	r.mu.Lock()
	last, attr := r.last, r.attr
	r.mu.Unlock()
	if last != nil {
		r.d.sendMAD(r.peer, attr, r.tid, last)
		return
	}
	// The consumer has not answered yet: acknowledge the REQ with an MRA
	// so the active side stops repeating it and waits (IBA 12.6.6).
	mra := ib.MRA{CommIDs: ib.CommIDs{Local: r.local, Remote: r.req.LocalCommID}, MessageMRAed: ib.MsgREQ, ServiceTimeout: mraServiceTimeout}
	var data [ib.CMDataLen]byte
	mra.Encode(&data)
	r.d.sendMAD(r.peer, ib.AttrMRA, r.tid, &data)
}

// localACKTimeout is the local ACK timeout our REQs ask for:
// 4.096 µs × 2^14 ≈ 67 ms.
const localACKTimeout = 14

// mraServiceTimeout is the service timeout an MRA of ours announces:
// 4.096 µs × 2^21 ≈ 8.6 s for the consumer to accept or reject.
const mraServiceTimeout = 21

// ackTimeout is a local ACK timeout field's duration; 0 (the field's
// "infinite") and anything under a millisecond get the RC default.
func ackTimeout(t uint8) time.Duration {
	if d := serviceTime(t); t != 0 && d >= time.Millisecond {
		return d
	}
	return 0
}

// serviceTime is a CM timeout field's duration: 4.096 µs × 2^t.
func serviceTime(t uint8) time.Duration {
	return time.Duration(4096<<min(t, 31)) * time.Nanosecond
}

func (r *connRequest) established() {
	r.once.Do(func() { close(r.ready) })
	r.forget(0)
}

// Accept implements rdma.ConnRequest: REP, then the QP is ready once the
// RTU (or the first packet on the QP) arrives.
func (r *connRequest) Accept(p rdma.ConnParams) (rdma.QP, error) {
	return r.AcceptContext(context.Background(), p)
}

// AcceptContext is Accept that gives up when ctx ends before the RTU has
// come (rdma.AcceptContext): the queue pair is dropped and the request
// forgotten, as when the RTU never comes.
func (r *connRequest) AcceptContext(ctx context.Context, p rdma.ConnParams) (rdma.QP, error) {
	d := r.d
	if len(p.PrivateData) > 196 {
		return nil, fmt.Errorf("roce: %d bytes of private data, a REP holds 196", len(p.PrivateData))
	}
	p.QP.Defaults()
	p.QP.IRD = min(p.QP.IRD, int(r.req.InitiatorDepth))
	p.QP.ORD = min(p.QP.ORD, int(r.req.ResponderResources))
	// Starting PSNs as in Dial: we send from the REQ's, and advertise
	// in the REP the PSN we expect.
	// Retransmission as the REQ negotiated it: its retry counts, and the
	// local ACK timeout of its primary path (4.096 µs × 2^n).
	cfg := RCConfig{QPConfig: p.QP, PD: p.PD, SendPSN: r.req.StartingPSN, RecvPSN: randU32() & psnMask,
		Timeout: ackTimeout(r.req.Primary.LocalACKTimeout), RetryCount: int(r.req.RetryCount), RNRRetryCount: int(r.req.RNRRetryCount),
		RemoteQPN: r.req.LocalQPN, MTU: min(d.mtu, 128<<r.req.PathMTU),
		LocalAddr: r.LocalAddr(), RemoteAddr: r.RemoteAddr()}
	q := d.newQP(cfg, r.peer)
	for _, w := range p.Recvs {
		q.PostRecv(w)
	}
	rep := ib.REP{LocalCommID: r.local, RemoteCommID: r.req.LocalCommID, LocalQPN: q.cfg.LocalQPN, StartingPSN: q.cfg.RecvPSN,
		ResponderResources: uint8(p.QP.IRD), InitiatorDepth: uint8(p.QP.ORD), TargetACKDelay: 15, RNRRetryCount: 7, LocalCAGUID: d.guid}
	copy(rep.PrivateData[:], p.PrivateData)
	data := new([ib.CMDataLen]byte)
	rep.Encode(data)
	r.mu.Lock()
	r.last, r.attr, r.q = data, ib.AttrREP, q
	r.mu.Unlock()
	d.mu.Lock()
	d.accepts[r.local] = r
	d.waitRTU[q.cfg.LocalQPN] = r
	d.conns[r.local] = &connection{qp: q, local: r.local, remote: r.req.LocalCommID, remoteQPN: r.req.LocalQPN, peer: r.peer}
	d.mu.Unlock()
	d.sendMAD(r.peer, ib.AttrREP, r.tid, data)
	drop := func(err error) (rdma.QP, error) {
		d.dropQP(q)
		q.Close()
		d.mu.Lock()
		delete(d.accepts, r.local)
		delete(d.waitRTU, q.cfg.LocalQPN)
		delete(d.conns, r.local)
		d.mu.Unlock()
		r.forget(0)
		return nil, err
	}
	t := time.NewTimer(cmTimeout)
	defer t.Stop()
	for try := 0; ; try++ {
		select {
		case <-r.ready:
			return q, nil
		case <-t.C:
			if try == cmRetries {
				return drop(errors.New("roce: no RTU after the REP"))
			}
			d.sendMAD(r.peer, ib.AttrREP, r.tid, data)
			t.Reset(cmTimeout)
		case <-ctx.Done():
			select {
			case <-r.ready:
				return q, nil
			default:
			}
			return drop(fmt.Errorf("roce: no RTU after the REP: %w", context.Cause(ctx)))
		case <-d.done:
			return nil, rdma.ErrClosed
		}
	}
}

// Reject implements rdma.ConnRequest: REJ with reason 28 (consumer
// reject) and the private data; printable private data (a reason in
// words) goes into the ARI as well, as the iSER-on-InfiniBand draft asks of a reject 28.
func (r *connRequest) Reject(privateData []byte) error {
	ari := ""
	if printable(privateData) {
		ari = string(privateData)
	}
	return r.RejectReason(ib.RejConsumerReject, ari, privateData)
}

// printable reports whether b is non-empty text.
func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return len(b) > 0
}

// RejectReason implements rdma.ReasonRejecter: a REJ with any reason, the
// ARI (72 bytes at most) and private data (148).
func (r *connRequest) RejectReason(reason int, ari string, privateData []byte) error {
	if len(privateData) > ib.RejPrivateDataLength {
		return fmt.Errorf("roce: %d bytes of private data, a REJ holds %d", len(privateData), ib.RejPrivateDataLength)
	}
	rej := ib.REJ{LocalCommID: r.local, RemoteCommID: r.req.LocalCommID, MessageRejected: ib.MsgREQ, Reason: uint16(reason)}
	rej.ARILength = uint8(copy(rej.ARI[:], ari))
	copy(rej.PrivateData[:], privateData)
	data := new([ib.CMDataLen]byte)
	rej.Encode(data)
	r.mu.Lock()
	r.last, r.attr = data, ib.AttrREJ
	r.mu.Unlock()
	r.d.sendMAD(r.peer, ib.AttrREJ, r.tid, data)
	r.forget(rejectGrace)
	return nil
}

// rejectGrace is how long a rejected REQ is remembered, so that the
// active side's retries (cmRetries × cmTimeout) get the same REJ.
const rejectGrace = cmRetries * cmTimeout

var (
	_ rdma.Fabric         = (*Device)(nil)
	_ rdma.ConnRequest    = (*connRequest)(nil)
	_ rdma.ReasonRejecter = (*connRequest)(nil)
)

// BoundsHit counts the connection requests the device rejected for its
// bounds on those it remembers: all of them (conn_requests,
// Options.MaxConnRequests) and one address's (conn_requests_per_source).
func (d *Device) BoundsHit() map[string]uint64 {
	return d.counts.reqsRefused.Hits("conn_requests", "conn_requests_per_source")
}
