// Package rdma is blockwire's verbs API: the transport-neutral interface
// that iSER and SRP use to move data by RDMA, whatever carries it: the
// software iWARP device (rdma/siw), the software RoCEv2 device (rdma/roce),
// or a kernel RDMA device through rdma-core (rdma/verbs).
//
// It follows the verbs model of the RDMA-Capable Protocols that RFC 5046
// and draft-ietf-ips-iwarp-da (the Datamover Architecture) build on:
//
//   - a Device owns the STag namespace; a protection domain (PD) groups the
//     memory regions and queue pairs that may touch each other;
//   - a memory region (MR) names a buffer by an STag (iWARP) or R_Key
//     (InfiniBand) with access rights and either zero-based or VA-based
//     tagged offsets (the iSER-on-InfiniBand draft part IV: TO = base + offset);
//   - a queue pair (QP) is a reliable connection with a send queue (Send,
//     Send with Solicited Event, Send with Invalidate, Send with SE and
//     Invalidate, RDMA Write, RDMA Read) and a receive queue of posted
//     buffers; work completes into completion queues (CQ);
//   - a Fabric listens, connects, accepts and rejects connections, each
//     carrying private data, so the connection-first iSER login of the iSER-on-InfiniBand draft
//     and SRP logins can ride on it.
//
// Local buffers need no registration in this software model: a work
// request names them as Go byte slices. Remote access always goes through
// an MR and is checked against its bounds, rights and PD; a violation never
// touches memory outside the region.
//
// A hardware device (rdma/verbs, rdma-core's verbs through cgo) keeps the
// same API: its PD carries the device's registered Memory (NewHardwarePD),
// buffers taken from it (PD.Alloc) move without a copy, and a region with
// remote rights is named by the hardware's R_Key and the buffer's virtual
// address. A Go slice outside that memory still works, through a bounce
// buffer (one copy).
package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// Access is the set of rights of a memory region.
type Access uint8

// Access rights.
const (
	LocalWrite  Access = 1 << iota // target of RDMA Read Responses and receives
	RemoteRead                     // source of the peer's RDMA Reads
	RemoteWrite                    // sink of the peer's RDMA Writes
)

func (a Access) String() string {
	s := ""
	for _, f := range []struct {
		a Access
		n string
	}{{LocalWrite, "local-write"}, {RemoteRead, "remote-read"}, {RemoteWrite, "remote-write"}} {
		if a&f.a != 0 {
			if s != "" {
				s += "|"
			}
			s += f.n
		}
	}
	if s == "" {
		return "none"
	}
	return s
}

// Fault says why a remote access to memory was refused. Transports map it
// to their wire error codes (RDMAP Terminate codes, IB NAK syndromes).
type Fault uint8

// Faults, in the order RFC 5040 §4.8 lists the remote protection errors.
const (
	FaultNone           Fault = iota
	FaultInvalidSTag          // no such STag, or it is invalidated
	FaultBounds               // outside the region
	FaultAccess               // the region lacks the right
	FaultNotAssociated        // the region belongs to another PD
	FaultWrap                 // tagged offset + length wraps
	FaultNotInvalidable       // the region cannot be invalidated remotely
)

var faultNames = [...]string{"none", "invalid STag", "base or bounds violation", "access rights violation",
	"STag not associated with this stream", "tagged offset wraps", "STag cannot be invalidated"}

func (f Fault) String() string {
	if int(f) < len(faultNames) {
		return faultNames[f]
	}
	return fmt.Sprintf("fault %d", uint8(f))
}

// Device is a software RDMA device: the STag namespace its memory regions
// live in. STags are index<<8 | key, the layout Linux siw uses; the key
// byte changes on every (re)mapping so stale STags are refused.
type Device struct {
	name string

	// mu guards the regions. Never held while calling out of this
	// package (a hardware queue pair's Windows take the queue pair's
	// locks, under which it reads regions): lock order QP → mu.
	mu     sync.RWMutex
	mrs    []*MR
	free   []uint32
	nextPD uint32
}

// NewDevice returns an empty device.
func NewDevice(name string) *Device { return &Device{name: name} }

// Name is the device's name.
func (d *Device) Name() string { return d.name }

// AllocPD returns a new protection domain.
func (d *Device) AllocPD() *PD {
	d.mu.Lock()
	d.nextPD++
	id := d.nextPD
	d.mu.Unlock()
	return &PD{dev: d, id: id}
}

// PD is a protection domain.
type PD struct {
	dev *Device
	id  uint32
	mem Memory // a hardware device's registered memory; nil: software
}

// Device is the device the PD belongs to.
func (pd *PD) Device() *Device { return pd.dev }

// Memory is memory registered with a hardware RDMA device (rdma/verbs):
// buffers outside the Go heap that the device reaches by DMA, pooled,
// owned by whoever holds them between Alloc and Free. Software devices
// have none: any Go slice will do.
type Memory interface {
	// Alloc returns n bytes of registered memory; ok is false when the
	// registration budget is spent (the caller then uses Go memory, at
	// the cost of a copy).
	Alloc(n int) (b []byte, ok bool)
	// Free gives back memory from Alloc; other slices are ignored.
	Free(b []byte)
	// RemoteKey is the R_Key and virtual address under which a peer
	// reaches b with the given rights; ok is false when b is not
	// registered memory with them.
	RemoteKey(b []byte, access Access) (rkey uint32, va uint64, ok bool)
}

// NewHardwarePD returns the protection domain of a hardware device whose
// registered memory is m. Its regions are the hardware's: Map names
// memory by m's R_Key and the buffer's virtual address (VA-based tagged
// offsets, the iSER-on-InfiniBand draft part IV: what a device without zero-based addressing
// uses), copying through memory from m when the buffer is not in it.
func NewHardwarePD(name string, m Memory) *PD {
	return &PD{dev: NewDevice(name), id: 1, mem: m}
}

// FabricPD is the protection domain a connection over f uses: a hardware
// fabric's own (rdma/verbs, whose memory is registered in it), else a new
// one on a software device named name.
func FabricPD(f Fabric, name string) *PD {
	if h, ok := f.(PDOwner); ok {
		return h.PD()
	}
	return NewDevice(name).AllocPD()
}

// PDOwner is a fabric (or a queue pair) whose connections use a
// protection domain of its own: a hardware device's, in which its memory
// is registered.
type PDOwner interface{ PD() *PD }

// WindowBinder is a queue pair that may offer memory windows: Windows
// returns them, or nil when its device has none.
type WindowBinder interface{ Windows() Windows }

// Memory is the PD's registered memory (nil on a software device).
func (pd *PD) Memory() Memory { return pd.mem }

// Alloc returns a buffer of n bytes the PD's device moves without a copy:
// registered memory on a hardware device while its budget lasts, else Go
// memory. Give it back with Free.
func (pd *PD) Alloc(n int) []byte {
	if pd.mem != nil {
		if b, ok := pd.mem.Alloc(n); ok {
			return b
		}
	}
	return make([]byte, n)
}

// Free gives back a buffer from Alloc; nobody may touch it afterwards.
func (pd *PD) Free(b []byte) {
	if pd.mem != nil {
		pd.mem.Free(b)
	}
}

// Windows is what a hardware queue pair offers when its device has memory
// windows (InfiniBand type 2; rxe and ConnectX have them, siw not): a key
// per I/O over registered memory, bound on the queue pair ahead of what is
// posted next and ended by the peer's Send with Invalidate or by a local
// invalidation — so a peer reaches exactly the buffer it was given, for as
// long as the I/O lasts. A queue pair without them (software devices,
// devices lacking windows) does not implement it, or returns nil from its
// Windows method.
type Windows interface {
	// BindWindow makes b, registered memory from the PD's Memory,
	// reachable by the peer with the given remote rights under a new key.
	BindWindow(b []byte, access Access) (Window, error)
}

// Window is one bound memory window.
type Window interface {
	RKey() uint32
	// VA is the address the peer names b[0] by (VA-based, the iSER-on-InfiniBand draft IV).
	VA() uint64
	// Invalidate ends the key, unless the peer's Send with Invalidate
	// already did. free, registered memory from the PD's Memory or nil,
	// is freed once the device refuses the key: the peer can no longer
	// reach it when it is reused.
	Invalidate(free []byte)
}

// MR is a memory region.
type MR struct {
	pd          *PD
	index       uint32
	invalidable bool // mapped with Map (fast registration): may be invalidated remotely

	// Guarded by pd.dev.mu.
	key    uint8
	valid  bool
	buf    []byte
	va     uint64
	access Access
	dead   bool

	// A hardware region (pd.mem set): the R_Key, and the bounce buffer
	// standing in for user when user is not registered memory; with
	// memory windows (win, from AllocMROn), the window of the current
	// mapping.
	rkey   uint32
	bounce []byte
	user   []byte
	win    Windows
	w      Window
}

// Register makes buf accessible under a new STag with the given rights.
// va is the tagged offset of buf[0]: 0 for zero-based offsets (RFC 5046's
// ZBTO), or any base the peer will add offsets to (VA-based, the iSER-on-InfiniBand draft).
// Such a region can be invalidated locally but not by the peer.
func (pd *PD) Register(buf []byte, va uint64, access Access) (*MR, error) {
	mr, err := pd.AllocMR()
	if err != nil {
		return nil, err
	}
	mr.invalidable = false
	if _, err := mr.Map(buf, va, access); err != nil {
		mr.Deregister()
		return nil, err
	}
	return mr, nil
}

// AllocMR reserves an STag index for fast registration: the region is
// invalid until Map binds a buffer to it, and a bound region may be
// invalidated locally (Invalidate) or remotely (Send with Invalidate).
// This is how per-I/O STags are made without allocating per I/O.
func (pd *PD) AllocMR() (*MR, error) {
	if pd.mem != nil {
		// The hardware's regions are the registered memory's; an MR
		// is a view of it (no per-I/O registration).
		return &MR{pd: pd}, nil
	}
	d := pd.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	mr := &MR{pd: pd, invalidable: true}
	if n := len(d.free); n > 0 {
		mr.index = d.free[n-1]
		d.free = d.free[:n-1]
		d.mrs[mr.index] = mr
	} else {
		if len(d.mrs) == 0 {
			d.mrs = append(d.mrs, nil) // index 0 unused: STag 0 stays invalid
		}
		if len(d.mrs) >= 1<<24 {
			return nil, errors.New("rdma: STag space exhausted")
		}
		mr.index = uint32(len(d.mrs))
		d.mrs = append(d.mrs, mr)
	}
	mr.key = uint8(mr.index) // any start; Map moves it on
	return mr, nil
}

// AllocMROn is AllocMR for regions the peer of qp reaches: on a hardware
// device whose queue pair has memory windows, each Map binds a window over
// just the buffer (a key per I/O, which the peer's Send with Invalidate or
// Invalidate ends); elsewhere it is AllocMR.
func (pd *PD) AllocMROn(qp QP) (*MR, error) {
	mr, err := pd.AllocMR()
	if err != nil || pd.mem == nil {
		return mr, err
	}
	if h, ok := qp.(WindowBinder); ok {
		mr.win = h.Windows()
	}
	return mr, nil
}

// Map binds buf (tagged offset va for buf[0]) with the given rights and a
// fresh key, and returns the region's new STag. A previously advertised
// STag of this region stops working.
func (mr *MR) Map(buf []byte, va uint64, access Access) (uint32, error) {
	if va+uint64(len(buf)) < va {
		return 0, fmt.Errorf("rdma: region at %#x of %d bytes wraps", va, len(buf))
	}
	if mr.pd.mem != nil {
		return mr.mapHardware(buf, access)
	}
	d := mr.pd.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if mr.dead {
		return 0, errors.New("rdma: region deregistered")
	}
	mr.key++
	mr.valid, mr.buf, mr.va, mr.access = true, buf, va, access
	return mr.index<<8 | uint32(mr.key), nil
}

// mapHardware is Map on a hardware device. A region with remote rights
// is registered memory named by its virtual address (the va asked for is
// ignored) under a window's key of its own (memory windows) or else the
// memory's R_Key; a buffer outside registered memory is copied into
// memory that is (in now for RemoteRead, out at Invalidate for
// RemoteWrite). A local region needs no key: the queue pair finds the
// local key of the memory at post time.
//
// A hardware region belongs to one owner at a time (the task using it):
// its fields change only here, in Invalidate and in Deregister, under
// d.mu. Without windows that is one locked section per call; with
// windows the window calls (which take the queue pair's locks) happen
// outside it (mapWindow).
func (mr *MR) mapHardware(buf []byte, access Access) (uint32, error) {
	if mr.win != nil {
		return mr.mapWindow(buf, access)
	}
	d := mr.pd.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if mr.dead {
		return 0, errors.New("rdma: region deregistered")
	}
	mr.releaseBounce()
	mr.valid, mr.access, mr.buf, mr.va, mr.rkey = true, access, buf, 0, 0
	if access&(RemoteRead|RemoteWrite) == 0 || len(buf) == 0 {
		return 0, nil
	}
	m := mr.pd.mem
	rkey, addr, ok := m.RemoteKey(buf, access)
	if !ok {
		b, ok := m.Alloc(len(buf))
		if !ok {
			mr.valid = false
			return 0, fmt.Errorf("rdma: no registered memory left for a %d-byte region", len(buf))
		}
		if access&RemoteRead != 0 {
			copy(b, buf)
		}
		if rkey, addr, ok = m.RemoteKey(b, access); !ok {
			m.Free(b)
			mr.valid = false
			return 0, errors.New("rdma: registered memory lacks the rights asked for")
		}
		mr.bounce, mr.user, mr.buf = b, buf, b
	}
	mr.va, mr.rkey = addr, rkey
	return rkey, nil
}

// releaseBounce ends a window-less hardware region's bounce: what the
// peer wrote is copied out, the bounce buffer goes back. Called with d.mu
// held.
func (mr *MR) releaseBounce() {
	if mr.bounce == nil {
		return
	}
	if mr.valid && mr.access&(RemoteWrite|LocalWrite) != 0 {
		copy(mr.user, mr.bounce)
	}
	mr.pd.mem.Free(mr.bounce)
	mr.bounce, mr.user = nil, nil
}

// mapWindow is mapHardware with memory windows: the buffer (or its
// bounce) is reached under a window bound over just it.
func (mr *MR) mapWindow(buf []byte, access Access) (uint32, error) {
	mr.releaseWindow()
	d := mr.pd.dev
	d.mu.Lock()
	if mr.dead {
		d.mu.Unlock()
		return 0, errors.New("rdma: region deregistered")
	}
	mr.valid, mr.access, mr.buf, mr.va, mr.rkey = true, access, buf, 0, 0
	d.mu.Unlock()
	if access&(RemoteRead|RemoteWrite) == 0 || len(buf) == 0 {
		return 0, nil
	}
	m := mr.pd.mem
	b, bounce := buf, []byte(nil)
	// With no rights asked, RemoteKey says whether buf is registered
	// memory at all.
	if _, _, ok := m.RemoteKey(buf, 0); !ok {
		nb, ok := m.Alloc(len(buf))
		if !ok {
			mr.invalid()
			return 0, fmt.Errorf("rdma: no registered memory left for a %d-byte region", len(buf))
		}
		if access&RemoteRead != 0 {
			copy(nb, buf)
		}
		b, bounce = nb, nb
	}
	w, err := mr.win.BindWindow(b, access&(RemoteRead|RemoteWrite))
	if err != nil {
		if bounce != nil {
			m.Free(bounce)
		}
		mr.invalid()
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if bounce != nil {
		mr.bounce, mr.user, mr.buf = bounce, buf, bounce
	}
	mr.w, mr.va, mr.rkey = w, w.VA(), w.RKey()
	return mr.rkey, nil
}

func (mr *MR) invalid() {
	d := mr.pd.dev
	d.mu.Lock()
	mr.valid = false
	d.mu.Unlock()
}

// releaseWindow ends a windowed region's mapping: what the peer wrote
// into a bounce buffer is copied out, the window is invalidated, and the
// bounce buffer goes back once the window's key is dead. Not under d.mu.
func (mr *MR) releaseWindow() {
	d := mr.pd.dev
	d.mu.Lock()
	w, bounce, user := mr.w, mr.bounce, mr.user
	if bounce != nil && mr.valid && mr.access&(RemoteWrite|LocalWrite) != 0 {
		copy(user, bounce)
	}
	mr.w, mr.bounce, mr.user = nil, nil, nil
	d.mu.Unlock()
	switch {
	case w != nil:
		w.Invalidate(bounce)
	case bounce != nil:
		mr.pd.mem.Free(bounce)
	}
}

// STag is the region's current STag (R_Key).
func (mr *MR) STag() uint32 {
	d := mr.pd.dev
	d.mu.RLock()
	defer d.mu.RUnlock()
	if mr.pd.mem != nil {
		return mr.rkey
	}
	return mr.index<<8 | uint32(mr.key)
}

// VA is the tagged offset of the first byte.
func (mr *MR) VA() uint64 {
	d := mr.pd.dev
	d.mu.RLock()
	defer d.mu.RUnlock()
	return mr.va
}

// Buf is the bound buffer.
func (mr *MR) Buf() []byte {
	d := mr.pd.dev
	d.mu.RLock()
	defer d.mu.RUnlock()
	return mr.buf
}

// Valid reports whether the region currently accepts access.
func (mr *MR) Valid() bool {
	d := mr.pd.dev
	d.mu.RLock()
	defer d.mu.RUnlock()
	return mr.valid
}

// Invalidate stops all access through the current STag (local
// invalidation); Map makes the region usable again under a new STag.
//
// On a hardware device with memory windows the window's key ends (a
// local invalidation, unless the peer's Send with Invalidate did it);
// without them the memory's R_Key stays usable by the peer (the regions
// are the connection's registered memory, not a key per I/O). A bounce
// buffer's contents are copied out here.
func (mr *MR) Invalidate() {
	if mr.win != nil {
		mr.releaseWindow()
	}
	d := mr.pd.dev
	d.mu.Lock()
	if mr.pd.mem != nil && mr.win == nil {
		mr.releaseBounce()
	}
	mr.valid = false
	d.mu.Unlock()
}

// Settle copies what the peer wrote into the region's bounce buffer out
// to the caller's buffer now and gives the bounce back (on a device with
// windows, ending the window too): an initiator settles its read region
// when the SCSI Response arrives, so the data is in its buffer when the
// response is delivered, not only once the task is deallocated. A region
// without a bounce buffer is left as it is; what Invalidate does later
// then has nothing more to copy.
func (mr *MR) Settle() {
	if mr.pd.mem == nil {
		return // a software device's regions are the buffers themselves
	}
	d := mr.pd.dev
	d.mu.Lock()
	bounce := mr.bounce != nil
	if bounce && mr.win == nil {
		mr.releaseBounce()
	}
	d.mu.Unlock()
	if bounce && mr.win != nil {
		mr.releaseWindow()
	}
}

// Deregister invalidates the region and frees its index.
func (mr *MR) Deregister() {
	d := mr.pd.dev
	if mr.win != nil {
		mr.releaseWindow()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if mr.dead {
		return
	}
	if mr.pd.mem != nil {
		if mr.win == nil {
			mr.releaseBounce()
		}
		mr.dead, mr.valid, mr.buf = true, false, nil
		return
	}
	mr.dead, mr.valid, mr.buf = true, false, nil
	d.mrs[mr.index] = nil
	d.free = append(d.free, mr.index)
}

// Resolve checks an access of n bytes at tagged offset to through stag on
// behalf of a queue pair in pd needing the right want, and returns the
// bytes to touch. The check is complete — valid STag, same PD, rights,
// no wrap, inside the region — so a transport that places only into the
// returned slice can never write outside registered memory.
func (d *Device) Resolve(stag uint32, pd *PD, want Access, to uint64, n int) ([]byte, Fault) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	idx := stag >> 8
	if idx == 0 || int(idx) >= len(d.mrs) {
		return nil, FaultInvalidSTag
	}
	mr := d.mrs[idx]
	if mr == nil || !mr.valid || uint8(stag) != mr.key {
		return nil, FaultInvalidSTag
	}
	if mr.pd != pd {
		return nil, FaultNotAssociated
	}
	if mr.access&want != want {
		return nil, FaultAccess
	}
	end := to + uint64(n)
	if end < to {
		return nil, FaultWrap
	}
	if to < mr.va || end > mr.va+uint64(len(mr.buf)) {
		return nil, FaultBounds
	}
	off := to - mr.va
	return mr.buf[off : off+uint64(n) : off+uint64(n)], FaultNone
}

// InvalidateRemote carries out a remote invalidation of stag (Send with
// Invalidate, RFC 5040 §5.4) for a queue pair in pd.
func (d *Device) InvalidateRemote(stag uint32, pd *PD) Fault {
	d.mu.Lock()
	defer d.mu.Unlock()
	idx := stag >> 8
	if idx == 0 || int(idx) >= len(d.mrs) {
		return FaultInvalidSTag
	}
	mr := d.mrs[idx]
	if mr == nil || uint8(stag) != mr.key {
		return FaultInvalidSTag
	}
	if mr.pd != pd {
		return FaultNotAssociated
	}
	if !mr.invalidable {
		return FaultNotInvalidable
	}
	mr.valid = false
	return FaultNone
}

// Op is the kind of a work request or completion.
type Op uint8

// Work request and completion kinds.
const (
	OpSend  Op = iota // Send; with Solicited and/or InvalidateSTag set, the other Send variants
	OpWrite           // RDMA Write
	OpRead            // RDMA Read
	OpRecv            // completion of a posted receive
)

var opNames = [...]string{"send", "rdma-write", "rdma-read", "recv"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op %d", uint8(o))
}

// MaxSGE is the most local buffers one work request may gather.
const MaxSGE = 4

// SendWR is a send-queue work request.
type SendWR struct {
	ID uint64
	Op Op

	// Local data to send or write (Send, Write), gathered in order.
	SG [][]byte

	// Send variants (RFC 5040 §4.2): Solicited asks the peer for a
	// solicited event; Invalidate with InvalidateSTag makes it a Send with
	// Invalidate, naming an STag of the peer's to invalidate.
	Solicited      bool
	Invalidate     bool
	InvalidateSTag uint32

	// Remote memory: the sink of a Write, the source of a Read.
	RemoteSTag uint32
	RemoteTO   uint64

	// Read only: Length bytes land in the local region Sink at SinkTO.
	Sink   *MR
	SinkTO uint64
	Length int

	// Fence holds this request until every earlier RDMA Read completed.
	Fence bool
	// Unsignaled suppresses the completion of a successful request.
	Unsignaled bool
}

// RecvWR is a receive buffer posted for one incoming Send.
type RecvWR struct {
	ID  uint64
	Buf []byte
}

// Status of a completion.
type Status uint8

// Completion statuses.
const (
	Success         Status = iota
	Flushed                // the QP failed or closed before the request ran
	LocalLength            // a received message was longer than the buffer
	LocalProtection        // a local region refused the access
	RemoteAccess           // the peer refused (Terminate / NAK)
	RemoteOperation        // the peer reported another error
	TransportError         // the connection broke
)

var statusNames = [...]string{"success", "flushed", "local length error", "local protection error",
	"remote access error", "remote operation error", "transport error"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status %d", uint8(s))
}

// Completion reports one finished work request.
type Completion struct {
	ID     uint64
	Op     Op
	Status Status
	// Len is the number of bytes received (OpRecv) or moved.
	Len int
	// Receive side of a Send variant.
	Solicited   bool
	Invalidated bool   // the Send invalidated one of our STags…
	STag        uint32 // …this one
	// QP the request belonged to.
	QP QP
}

// CQ is a completion queue shared by any number of queue pairs.
type CQ struct {
	mu     sync.Mutex
	ring   []Completion
	head   int
	n      int
	notify chan struct{}
	closed bool
}

// NewCQ returns a completion queue sized for depth entries. It grows if
// more completions are pending than that, so none is ever lost.
func NewCQ(depth int) *CQ {
	if depth < 1 {
		depth = 1
	}
	return &CQ{ring: make([]Completion, depth), notify: make(chan struct{}, 1)}
}

// Push queues a completion; transports call it.
func (cq *CQ) Push(c Completion) {
	cq.mu.Lock()
	if cq.n == len(cq.ring) {
		grown := make([]Completion, 2*len(cq.ring))
		for i := 0; i < cq.n; i++ {
			grown[i] = cq.ring[(cq.head+i)%len(cq.ring)]
		}
		cq.ring, cq.head = grown, 0
	}
	cq.ring[(cq.head+cq.n)%len(cq.ring)] = c
	cq.n++
	cq.mu.Unlock()
	select {
	case cq.notify <- struct{}{}:
	default:
	}
}

// Poll moves up to len(dst) pending completions into dst without
// blocking and returns how many.
func (cq *CQ) Poll(dst []Completion) int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	k := 0
	for k < len(dst) && cq.n > 0 {
		dst[k] = cq.ring[cq.head]
		cq.ring[cq.head] = Completion{}
		cq.head = (cq.head + 1) % len(cq.ring)
		cq.n--
		k++
	}
	return k
}

// ErrCQClosed is returned by Wait after Close.
var ErrCQClosed = errors.New("rdma: completion queue closed")

// Wait blocks until at least one completion is pending, then polls.
func (cq *CQ) Wait(ctx context.Context, dst []Completion) (int, error) {
	for {
		if n := cq.Poll(dst); n > 0 {
			return n, nil
		}
		cq.mu.Lock()
		closed := cq.closed
		cq.mu.Unlock()
		if closed {
			return 0, ErrCQClosed
		}
		select {
		case <-cq.notify:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Close wakes waiters; Wait then returns ErrCQClosed once drained.
func (cq *CQ) Close() {
	cq.mu.Lock()
	cq.closed = true
	cq.mu.Unlock()
	select {
	case cq.notify <- struct{}{}:
	default:
	}
}

// QPConfig sizes a queue pair.
type QPConfig struct {
	SendCQ, RecvCQ       *CQ
	SendDepth, RecvDepth int // outstanding work requests per queue
	// IRD is how many RDMA Reads the peer may have outstanding against
	// us, ORD how many we may have outstanding against it; the connection
	// manager negotiates both down to what the other side accepts.
	IRD, ORD int
}

// Defaults fills unset sizes.
func (c *QPConfig) Defaults() {
	if c.SendDepth <= 0 {
		c.SendDepth = 128
	}
	if c.RecvDepth <= 0 {
		c.RecvDepth = 128
	}
	if c.IRD <= 0 {
		c.IRD = 16
	}
	if c.ORD <= 0 {
		c.ORD = 16
	}
}

// QPAttr describes an established queue pair.
type QPAttr struct {
	Transport             string // "iwarp", "roce", …
	IRD, ORD              int    // negotiated
	LocalAddr, RemoteAddr net.Addr
	// Transport details, for logs and admin listings.
	Detail string
}

// QP is a reliable connected queue pair.
type QP interface {
	// PostSend queues a send-queue work request. Buffers in wr.SG and the
	// Sink region belong to the QP until its completion.
	PostSend(wr *SendWR) error
	// PostRecv queues a receive buffer.
	PostRecv(wr RecvWR) error
	PD() *PD
	Attr() QPAttr
	// Done is closed when the QP has left the connected state; Err then
	// says why (nil after a local Close).
	Done() <-chan struct{}
	Err() error
	// Close ends the connection: work still queued is flushed.
	Close() error
}

// ConnParams are what one side brings to a connection.
type ConnParams struct {
	PD          *PD
	QP          QPConfig
	PrivateData []byte
	// Recvs are posted before the connection carries any traffic, so a
	// peer that sends at once (an iSER Login Request, an SRP IU) always
	// finds a buffer.
	Recvs []RecvWR
	// ServiceIDBase is, for a Dial over an InfiniBand CM fabric, the base
	// the port is added to for the REQ's service ID: 0 for the RDMA/CM
	// port space Linux uses (0x0000000001060000, its 36-byte header
	// before PrivateData), or another base whose REQ carries PrivateData
	// alone — the iSER-on-InfiniBand draft's iSER base 0x0000000000020000, or an SRP I/O
	// controller's whole service ID less its low 16 bits (which the
	// address's port then gives). iWARP ignores it.
	ServiceIDBase uint64
}

// Fabric is a transport's connection manager.
type Fabric interface {
	// Listen returns a listener for connection requests on addr.
	Listen(addr string) (Listener, error)
	// Dial connects to addr; it returns the QP and the private data of
	// the peer's accept, or a *RejectError.
	Dial(ctx context.Context, addr string, p ConnParams) (QP, []byte, error)
}

// Listener yields connection requests.
type Listener interface {
	Accept(ctx context.Context) (ConnRequest, error)
	Addr() net.Addr
	Close() error
}

// ConnRequest is a peer's request to connect, to be accepted or rejected.
type ConnRequest interface {
	PrivateData() []byte
	// PeerIRD and PeerORD are the read depths the peer offered (0 when the
	// transport does not carry them).
	PeerIRD() int
	PeerORD() int
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
	Accept(p ConnParams) (QP, error)
	Reject(privateData []byte) error
}

// CMPortSpace is a ConnRequest that says which connection manager's
// port space it came through: RDMACM is true for RDMA/CM's (its private
// data began with the RDMA/CM header; Linux's ib_srp then sends the
// shorter SRP login), false for a raw InfiniBand CM request to a service
// ID of the listener's own. Requests that do not implement it came
// through RDMA/CM.
type CMPortSpace interface{ RDMACM() bool }

// ContextAccepter is a ConnRequest whose Accept can be given up: a
// fabric that waits for the peer after answering (the InfiniBand CM's
// RTU) stops waiting when ctx ends.
type ContextAccepter interface {
	AcceptContext(ctx context.Context, p ConnParams) (QP, error)
}

// AcceptContext accepts req, giving up when ctx ends where the fabric
// can (ContextAccepter); elsewhere it is req.Accept.
func AcceptContext(ctx context.Context, req ConnRequest, p ConnParams) (QP, error) {
	if ca, ok := req.(ContextAccepter); ok {
		return ca.AcceptContext(ctx, p)
	}
	return req.Accept(p)
}

// RejectError is a connection request the peer refused.
type RejectError struct {
	// Reason is the transport's reject code (InfiniBand CM reason; 0 for
	// iWARP, which has none).
	Reason      int
	PrivateData []byte
	// ARI is the InfiniBand REJ's additional rejection information
	// (the iSER-on-InfiniBand draft: a readable reason with consumer reject, 28).
	ARI []byte
}

// InfiniBand CM reject reasons a consumer may give (IBA 12.6.7).
const (
	RejectNoQP           = 1  // no QP available: the SRP InfiniBand annex §A.4, more hosts than channels
	RejectConsumerReject = 28 // the consumer refused the private data
)

// ReasonRejecter is a ConnRequest whose fabric's rejects carry a reason
// (the InfiniBand CM's REJ); iWARP's MPA reject has none, so consumers
// fall back to Reject.
type ReasonRejecter interface {
	// RejectReason refuses with the reason, a readable explanation (the
	// ARI, up to 72 bytes) and private data.
	RejectReason(reason int, ari string, privateData []byte) error
}

func (e *RejectError) Error() string {
	if e.Reason != 0 {
		return fmt.Sprintf("rdma: connection rejected (reason %d, %d bytes of private data)", e.Reason, len(e.PrivateData))
	}
	return fmt.Sprintf("rdma: connection rejected (%d bytes of private data)", len(e.PrivateData))
}

// TerminateError is a connection ended by a protocol error, found locally
// or reported by the peer.
type TerminateError struct {
	Remote bool   // the peer sent it
	Layer  string // "RDMAP", "DDP", "LLP" (or the transport's names)
	EType  uint8
	Code   uint8
	Msg    string
}

func (e *TerminateError) Error() string {
	who := "local"
	if e.Remote {
		who = "peer"
	}
	return fmt.Sprintf("rdma: %s terminated the stream: %s error type %d code %#02x: %s", who, e.Layer, e.EType, e.Code, e.Msg)
}

// ErrClosed is returned by work posted to a closed queue pair.
var ErrClosed = errors.New("rdma: queue pair closed")

// ErrDisconnected is the Err of a queue pair whose peer closed the
// connection without an error.
var ErrDisconnected = errors.New("rdma: peer disconnected")

// ErrSetupFailed is wrapped by a Dial whose connection's set-up failed
// below the peer's consumer: the connection manager reported an error
// (RDMA/CM's CONNECT_ERROR; on siw, an MPA exchange cut short), neither an
// answer (RejectError) nor silence. The peer may accept a moment later.
var ErrSetupFailed = errors.New("rdma: connection set-up failed")

// ErrQueueFull is returned when a queue already holds its depth.
var ErrQueueFull = errors.New("rdma: work queue full")
