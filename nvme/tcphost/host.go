package tcphost

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/dhchap"
)

// noDeadline clears a connection's deadline.
var noDeadline time.Time

// DiscoveryNQN is the well-known NQN of a discovery subsystem.
const DiscoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// Options configure a host's connection to a controller.
type Options struct {
	// HostNQN names the host (default: a UUID-based NQN from HostID).
	HostNQN string
	// HostID is the 128-bit host identifier (default: random).
	HostID [16]byte
	// HeaderDigest and DataDigest ask for CRC32C digests.
	HeaderDigest, DataDigest bool
	// KATO is the keep alive timeout asked for (default 10 s; the host
	// sends a Keep Alive every half of it). Discovery asks for none.
	KATO time.Duration
	// QueueSize is each I/O queue's entries (default 32); IOQueues how
	// many I/O queues (default 1).
	QueueSize, IOQueues int
	// DHCHAP is the host's DH-HMAC-CHAP secret: with it the host
	// authenticates every queue a controller asks it to (AUTHREQ.ATR);
	// DHCHAPCtrl, the controller's, makes the authentication
	// bidirectional (the controller proves itself too). A controller
	// that asks without a secret given is an error.
	DHCHAP, DHCHAPCtrl *dhchap.Secret
	// AuthHashes and AuthGroups are what the host offers (default: every
	// hash and group dhchap has).
	AuthHashes []dhchap.Hash
	AuthGroups []dhchap.Group
	// Dial opens a connection (default: net.Dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (o *Options) dial(ctx context.Context, addr string) (net.Conn, error) {
	if o.Dial != nil {
		return o.Dial(ctx, "tcp", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (o *Options) defaults() {
	if o.HostID == [16]byte{} {
		rand.Read(o.HostID[:])
	}
	if o.HostNQN == "" {
		u := o.HostID
		o.HostNQN = fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	}
	if o.KATO == 0 {
		o.KATO = 10 * time.Second
	}
	if o.QueueSize == 0 {
		o.QueueSize = 32
	}
	if o.IOQueues == 0 {
		o.IOQueues = 1
	}
}

// Controller is a host's association with a controller: its admin queue
// and I/O queues.
type Controller struct {
	o      Options
	addr   string
	subNQN string
	id     uint16
	admin  *queue
	io     []*queue
	ident  []byte // Identify Controller
	stop   chan struct{}
	wg     sync.WaitGroup
	next   uint32 // round robin over the I/O queues
	nextMu sync.Mutex
	seq    authSeq // the host's DH-HMAC-CHAP challenges
}

// Connect connects to subsystem subNQN at addr (host:port): the admin
// queue, the controller's enabling, Identify, then the I/O queues.
func Connect(ctx context.Context, addr, subNQN string, o Options) (*Controller, error) {
	o.defaults()
	discovery := subNQN == DiscoveryNQN
	kato := o.KATO
	if discovery {
		kato = 0
	}
	c := &Controller{o: o, addr: addr, subNQN: subNQN, stop: make(chan struct{})}
	var err error
	if c.admin, err = c.connectQueue(ctx, 0, 32, kato); err != nil {
		return nil, err
	}
	if err := c.enable(ctx); err != nil {
		c.admin.close(err)
		return nil, err
	}
	if c.ident, err = c.Identify(ctx, 1, 0); err != nil {
		c.admin.close(err)
		return nil, err
	}
	if kato > 0 {
		c.wg.Add(1)
		go c.keepAlive(kato)
	}
	if discovery {
		return c, nil
	}
	// I/O queues: ask for them, then connect each.
	n := uint32(o.IOQueues - 1)
	cqe, err := c.Admin(ctx, &nvme.Command{Opcode: nvme.AdminSetFeatures, CDW: [6]uint32{0x07, n | n<<16}}, nil, NoData)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("tcphost: Set Features (Number of Queues): %w", err)
	}
	granted := min(int(uint16(cqe.DW0)), int(uint16(cqe.DW0>>16))) + 1
	inCapsule := int(binary.LittleEndian.Uint32(c.ident[1792:]))*16 - nvme.SQELen
	for qid := 1; qid <= min(o.IOQueues, granted); qid++ {
		q, err := c.connectQueue(ctx, uint16(qid), o.QueueSize, 0)
		if err != nil {
			c.Close()
			return nil, err
		}
		q.inCapsule = max(inCapsule, 0)
		c.io = append(c.io, q)
	}
	return c, nil
}

// connectQueue opens queue qid and sends its Connect.
func (c *Controller) connectQueue(ctx context.Context, qid uint16, size int, kato time.Duration) (*queue, error) {
	q, err := dialQueue(ctx, &c.o, c.addr, qid, size)
	if err != nil {
		return nil, err
	}
	k := nvme.Connect{QID: qid, SQSize: uint16(size - 1), KATO: uint32(kato / time.Millisecond),
		Data: nvme.ConnectData{HostID: c.o.HostID, CNTLID: 0xffff, SubNQN: c.subNQN, HostNQN: c.o.HostNQN}}
	if qid != 0 {
		k.Data.CNTLID = c.id
	}
	var cmd nvme.Command
	data := make([]byte, nvme.ConnectDataLen)
	k.Encode(&cmd, data)
	cqe, err := q.do(ctx, &cmd, data, ToController)
	if err != nil {
		q.close(err)
		return nil, fmt.Errorf("tcphost: Connect (queue %d): %w", qid, err)
	}
	if qid == 0 {
		c.id = uint16(cqe.DW0)
	}
	if cqe.DW0&(1<<17) != 0 { // AUTHREQ.ATR
		if err := c.authenticate(ctx, q); err != nil {
			q.close(err)
			return nil, fmt.Errorf("tcphost: authentication (queue %d): %w", qid, err)
		}
	}
	return q, nil
}

// enable sets CC.EN and waits for CSTS.RDY.
func (c *Controller) enable(ctx context.Context) error {
	const ccIOQueueEntrySizes = 6<<16 | 4<<20
	if err := c.setProperty(ctx, nvme.PropCC, nvme.CCEnable|ccIOQueueEntrySizes); err != nil {
		return fmt.Errorf("tcphost: enabling the controller: %w", err)
	}
	for {
		v, err := c.Property(ctx, nvme.PropCSTS, 4)
		if err != nil {
			return err
		}
		if v&nvme.CSTSReady != 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Property reads a controller property of size 4 or 8.
func (c *Controller) Property(ctx context.Context, off uint32, size int) (uint64, error) {
	var cmd nvme.Command
	(&nvme.Property{Offset: off, Size: size}).Encode(&cmd)
	cqe, err := c.admin.do(ctx, &cmd, nil, NoData)
	return uint64(cqe.DW0) | uint64(cqe.DW1)<<32, err
}

func (c *Controller) setProperty(ctx context.Context, off uint32, v uint32) error {
	var cmd nvme.Command
	(&nvme.Property{Set: true, Offset: off, Size: 4, Value: uint64(v)}).Encode(&cmd)
	_, err := c.admin.do(ctx, &cmd, nil, NoData)
	return err
}

// keepAlive sends Keep Alive every half of the timeout.
func (c *Controller) keepAlive(kato time.Duration) {
	defer c.wg.Done()
	t := time.NewTicker(kato / 2)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-c.admin.done:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), kato)
			c.Admin(ctx, &nvme.Command{Opcode: nvme.AdminKeepAlive}, nil, NoData)
			cancel()
		}
	}
}

// ID is the controller's CNTLID.
func (c *Controller) ID() uint16 { return c.id }

// IdentifyController is the Identify Controller data read at Connect.
func (c *Controller) IdentifyController() []byte { return c.ident }

// Admin sends an admin command.
func (c *Controller) Admin(ctx context.Context, cmd *nvme.Command, data []byte, dir Direction) (nvme.Completion, error) {
	return c.admin.do(ctx, cmd, data, dir)
}

// IO sends an I/O command on one of the I/O queues (round robin).
func (c *Controller) IO(ctx context.Context, cmd *nvme.Command, data []byte, dir Direction) (nvme.Completion, error) {
	q, err := c.pick()
	if err != nil {
		return nvme.Completion{}, err
	}
	return q.do(ctx, cmd, data, dir)
}

// pick is the next I/O queue, round robin.
func (c *Controller) pick() (*queue, error) {
	if len(c.io) == 0 {
		return nil, fmt.Errorf("tcphost: no I/O queues")
	}
	c.nextMu.Lock()
	q := c.io[c.next%uint32(len(c.io))]
	c.next++
	c.nextMu.Unlock()
	return q, nil
}

// Identify reads an Identify data structure (cns) of nsid.
func (c *Controller) Identify(ctx context.Context, cns uint8, nsid uint32) ([]byte, error) {
	b := make([]byte, 4096)
	_, err := c.Admin(ctx, &nvme.Command{Opcode: nvme.AdminIdentify, NSID: nsid, CDW: [6]uint32{uint32(cns)}}, b, FromController)
	return b, err
}

// LogPage reads n bytes of log page lid from off.
func (c *Controller) LogPage(ctx context.Context, lid uint8, nsid uint32, off uint64, n int) ([]byte, error) {
	b := make([]byte, n)
	numd := uint32(n/4 - 1)
	_, err := c.Admin(ctx, &nvme.Command{Opcode: nvme.AdminGetLogPage, NSID: nsid,
		CDW: [6]uint32{uint32(lid) | numd<<16, numd >> 16, uint32(off), uint32(off >> 32)}}, b, FromController)
	return b, err
}

// Namespaces lists the active namespace IDs.
func (c *Controller) Namespaces(ctx context.Context) ([]uint32, error) {
	b, err := c.Identify(ctx, 2, 0)
	if err != nil {
		return nil, err
	}
	var out []uint32
	for i := 0; i < len(b); i += 4 {
		id := binary.LittleEndian.Uint32(b[i:])
		if id == 0 {
			break
		}
		out = append(out, id)
	}
	return out, nil
}

// Namespace is what Identify Namespace says of one.
type Namespace struct {
	ID        uint32
	Blocks    uint64
	BlockSize int
	NGUID     [16]byte
	ReadOnly  bool
	Thin      bool // NSFEAT: thin provisioned (deallocation releases blocks)
}

// Namespace identifies namespace nsid.
func (c *Controller) Namespace(ctx context.Context, nsid uint32) (Namespace, error) {
	b, err := c.Identify(ctx, 0, nsid)
	if err != nil {
		return Namespace{}, err
	}
	ns := Namespace{ID: nsid, Blocks: binary.LittleEndian.Uint64(b[0:])}
	lbaf := b[128+4*int(b[26]&0xf):]
	ns.BlockSize = 1 << lbaf[2]
	copy(ns.NGUID[:], b[104:120])
	ns.ReadOnly = b[99]&1 != 0
	ns.Thin = b[24]&1 != 0
	if ns.Blocks == 0 {
		return ns, fmt.Errorf("tcphost: namespace %d is not active", nsid)
	}
	return ns, nil
}

// rwCommand builds a Read or Write of nlb blocks at lba.
func rwCommand(op uint8, nsid uint32, lba uint64, nlb int, fua bool) nvme.Command {
	cdw12 := uint32(nlb - 1)
	if fua {
		cdw12 |= 1 << 30
	}
	return nvme.Command{Opcode: op, NSID: nsid, CDW: [6]uint32{uint32(lba), uint32(lba >> 32), cdw12}}
}

// Read reads len(p) bytes (whole blocks of bs) at block lba.
func (c *Controller) Read(ctx context.Context, nsid uint32, bs int, lba uint64, p []byte) error {
	cmd := rwCommand(nvme.OpRead, nsid, lba, len(p)/bs, false)
	_, err := c.IO(ctx, &cmd, p, FromController)
	return err
}

// Write writes p (whole blocks of bs) at block lba, durably with fua.
func (c *Controller) Write(ctx context.Context, nsid uint32, bs int, lba uint64, p []byte, fua bool) error {
	cmd := rwCommand(nvme.OpWrite, nsid, lba, len(p)/bs, fua)
	_, err := c.IO(ctx, &cmd, p, ToController)
	return err
}

// Compare compares p with the blocks at lba: a *StatusError of
// nvme.StatusCompareFailure when they differ.
func (c *Controller) Compare(ctx context.Context, nsid uint32, bs int, lba uint64, p []byte) error {
	cmd := rwCommand(nvme.OpCompare, nsid, lba, len(p)/bs, false)
	_, err := c.IO(ctx, &cmd, p, ToController)
	return err
}

// CompareAndWrite writes data at lba only if the blocks there hold
// verify, atomically (a fused Compare and Write): a *StatusError of
// nvme.StatusCompareFailure when they differ.
func (c *Controller) CompareAndWrite(ctx context.Context, nsid uint32, bs int, lba uint64, verify, data []byte, fua bool) error {
	q, err := c.pick()
	if err != nil {
		return err
	}
	cmp := rwCommand(nvme.OpCompare, nsid, lba, len(verify)/bs, false)
	w := rwCommand(nvme.OpWrite, nsid, lba, len(data)/bs, fua)
	_, _, ec, ew := q.doFused(ctx, &cmp, verify, &w, data)
	if ec != nil {
		return ec
	}
	return ew
}

// Flush flushes namespace nsid (0xffffffff: all).
func (c *Controller) Flush(ctx context.Context, nsid uint32) error {
	_, err := c.IO(ctx, &nvme.Command{Opcode: nvme.OpFlush, NSID: nsid}, nil, NoData)
	return err
}

// WriteZeroes zeroes nlb blocks at lba (deallocating them with deac).
func (c *Controller) WriteZeroes(ctx context.Context, nsid uint32, lba uint64, nlb int, deac bool) error {
	cmd := rwCommand(nvme.OpWriteZeroes, nsid, lba, nlb, false)
	if deac {
		cmd.CDW[2] |= 1 << 25
	}
	_, err := c.IO(ctx, &cmd, nil, NoData)
	return err
}

// Deallocate releases nlb blocks at lba (Dataset Management, AD).
func (c *Controller) Deallocate(ctx context.Context, nsid uint32, lba uint64, nlb uint32) error {
	r := make([]byte, 16)
	binary.LittleEndian.PutUint32(r[4:], nlb)
	binary.LittleEndian.PutUint64(r[8:], lba)
	_, err := c.IO(ctx, &nvme.Command{Opcode: nvme.OpDatasetMgmt, NSID: nsid, CDW: [6]uint32{0, 1 << 2}}, r, ToController)
	return err
}

// Reservation Register's actions (RREGA) and CPTPL values.
const (
	ResvRegister   = 0
	ResvUnregister = 1
	ResvReplace    = 2
)

// ResvRegister sends Reservation Register: action (ResvRegister,
// ResvUnregister, ResvReplace), the current and the new key, IEKEY, and
// cptpl (0: no change, 2: persistence off, 3: on).
func (c *Controller) ResvRegister(ctx context.Context, nsid uint32, action uint8, cur, key uint64, ignoreKey bool, cptpl uint8) error {
	d := make([]byte, 16)
	binary.LittleEndian.PutUint64(d, cur)
	binary.LittleEndian.PutUint64(d[8:], key)
	cdw10 := uint32(action&7) | uint32(cptpl&3)<<30
	if ignoreKey {
		cdw10 |= 1 << 3
	}
	_, err := c.IO(ctx, &nvme.Command{Opcode: nvme.OpResvRegister, NSID: nsid, CDW: [6]uint32{cdw10}}, d, ToController)
	return err
}

// ResvAcquire sends Reservation Acquire: action 0 acquire, 1 preempt, 2
// preempt and abort; rtype 1 to 6; preempt is the key to preempt.
func (c *Controller) ResvAcquire(ctx context.Context, nsid uint32, action, rtype uint8, cur, preempt uint64) error {
	d := make([]byte, 16)
	binary.LittleEndian.PutUint64(d, cur)
	binary.LittleEndian.PutUint64(d[8:], preempt)
	cdw10 := uint32(action&7) | uint32(rtype)<<8
	_, err := c.IO(ctx, &nvme.Command{Opcode: nvme.OpResvAcquire, NSID: nsid, CDW: [6]uint32{cdw10}}, d, ToController)
	return err
}

// ResvRelease sends Reservation Release (clear: Clear).
func (c *Controller) ResvRelease(ctx context.Context, nsid uint32, rtype uint8, cur uint64, clear bool) error {
	d := make([]byte, 8)
	binary.LittleEndian.PutUint64(d, cur)
	cdw10 := uint32(rtype) << 8
	if clear {
		cdw10 |= 1
	}
	_, err := c.IO(ctx, &nvme.Command{Opcode: nvme.OpResvRelease, NSID: nsid, CDW: [6]uint32{cdw10}}, d, ToController)
	return err
}

// ResvRegistrant is one registrant of a Reservation Report.
type ResvRegistrant struct {
	CNTLID uint16 // FFFFh: no controller of this subsystem
	Holder bool
	Key    uint64
	HostID [16]byte
}

// ResvStatus is a Reservation Report (the extended data structure).
type ResvStatus struct {
	Generation  uint32
	Type        uint8
	Persist     bool
	Registrants []ResvRegistrant
}

// ResvReport sends Reservation Report with the extended data structure,
// room for 64 registrants.
func (c *Controller) ResvReport(ctx context.Context, nsid uint32) (ResvStatus, error) {
	d := make([]byte, 64+64*64)
	_, err := c.IO(ctx, &nvme.Command{Opcode: nvme.OpResvReport, NSID: nsid, CDW: [6]uint32{uint32(len(d)/4 - 1), 1}}, d, FromController)
	if err != nil {
		return ResvStatus{}, err
	}
	st := ResvStatus{Generation: binary.LittleEndian.Uint32(d), Type: d[4], Persist: d[9]&1 != 0}
	n := min(int(binary.LittleEndian.Uint16(d[5:])), 64)
	for i := range n {
		e := d[64+64*i:]
		r := ResvRegistrant{CNTLID: binary.LittleEndian.Uint16(e), Holder: e[2]&1 != 0, Key: binary.LittleEndian.Uint64(e[8:])}
		copy(r.HostID[:], e[16:32])
		st.Registrants = append(st.Registrants, r)
	}
	return st, nil
}

// Close shuts the controller down (CC.SHN, normal) and closes its queues.
func (c *Controller) Close() error {
	close(c.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := c.setProperty(ctx, nvme.PropCC, nvme.CCEnable|1<<14)
	for _, q := range c.io {
		q.close(ErrClosed)
	}
	c.admin.close(ErrClosed)
	c.wg.Wait()
	return err
}

// DiscoveryEntry is one discovery log page entry.
type DiscoveryEntry struct {
	TrType  uint8 // 3: TCP
	SubType uint8 // 2: NVM subsystem, 3: this discovery subsystem
	PortID  uint16
	Addr    string // TRADDR:TRSVCID
	SubNQN  string
}

// Discover reads the discovery log page of the discovery controller at
// addr.
func Discover(ctx context.Context, addr string, o Options) ([]DiscoveryEntry, error) {
	c, err := Connect(ctx, addr, DiscoveryNQN, o)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	hdr, err := c.LogPage(ctx, 0x70, 0, 0, 1024)
	if err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(hdr[8:])
	if n > 1024 {
		return nil, fmt.Errorf("tcphost: a discovery log of %d entries", n)
	}
	if n == 0 {
		return nil, nil
	}
	b, err := c.LogPage(ctx, 0x70, 0, 1024, int(n)*1024)
	if err != nil {
		return nil, err
	}
	out := make([]DiscoveryEntry, 0, n)
	for i := range int(n) {
		e := b[1024*i:]
		field := func(b []byte) string { return strings.TrimRight(string(b), " \x00") }
		out = append(out, DiscoveryEntry{TrType: e[0], SubType: e[2], PortID: binary.LittleEndian.Uint16(e[4:]),
			Addr: net.JoinHostPort(field(e[512:768]), field(e[32:64])), SubNQN: field(e[256:512])})
	}
	return out, nil
}
