// Package srptarget is the SRP target: it accepts SRP logins through the rdma
// connection manager (on iWARP the login rides in the MPA private data, as
// Linux ib_srp sends it over RDMA/CM), runs one RDMA channel per login,
// and drives the transport-neutral SCSI target core exactly as the iSCSI
// target does. Data-out is fetched with RDMA Reads from the initiator's
// descriptors and data-in is placed with RDMA Writes before the SRP_RSP
// Send, so iWARP's ordering makes the data visible first (the SRP InfiniBand annex, Annex
// A.3: initiators support inbound RDMA Read and Write; A.4: targets only
// receive Sends).
//
// Credit flow control: a channel grants as many credits (REQUEST LIMIT
// DELTA) as it has receive buffers for requests. Each SRP_CMD or
// SRP_TSK_MGMT holds its receive buffer until it is answered; the buffer
// is then posted again and its credit returned in the next SRP_RSP, or in
// an SRP_CRED_REQ when there is no response to carry it (an aborted task).
package srptarget

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/internal/bufpool"
	"github.com/blockwire/blockwire/internal/persource"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
	"github.com/blockwire/blockwire/srp"
)

// Options configure a Server.
type Options struct {
	// PD is the protection domain of the RDMA device the listeners
	// belong to: every channel's queue pair and memory live in it.
	PD *rdma.PD
	// Memory, when set, supplies the task buffers (an RDMA device's
	// registered memory: moved without a bounce copy).
	Memory rdma.Memory
	// Device is the SCSI target device whose logical units are served.
	Device *scsitarget.Device
	// IDExt and IOCGUID make up the target port ID (SRP r16a: id_ext then
	// the I/O controller GUID). Logins naming another target port are
	// rejected with "unable to associate RDMA channel with I_T nexus".
	IDExt, IOCGUID uint64
	// Credits is each channel's request limit (default 128).
	Credits int
	// MaxITIULen bounds the initiator-to-target IU length a login may ask
	// for (default 65536+68: immediate data up to 64 KiB).
	MaxITIULen int
	// MaxChannels limits the RDMA channels of all initiators together
	// (default 64); further logins are rejected with "RDMA channel limit
	// reached".
	MaxChannels int
	// MaxChannelsPerSource limits the channels (set up or being set up)
	// from one address (default 16), so that one initiator host cannot
	// take all MaxChannels; further logins are rejected with "RDMA
	// channel limit reached". Linux ib_srp opens a channel per completion
	// vector, up to 4 per NUMA node by default, and goes on with those it
	// got. Sources says what one address is (an IPv6 peer's network,
	// if asked).
	MaxChannelsPerSource int
	Sources              persource.Sources
	// MaxDescriptors limits the data buffer descriptors of one command
	// (default 32; Linux ib_srp sends at most cmd_sg_entries, 12 by
	// default).
	MaxDescriptors int
	// NoImmediate refuses immediate data (SRP-2).
	NoImmediate bool
	// Allow, when set, admits an initiator port logging in from remote;
	// others are rejected with "unable to associate RDMA channel with I_T
	// nexus".
	Allow func(initiator srp.PortID, remote net.Addr) bool
	// LUNMap, when set, gives an initiator port its view of the LUNs
	// (scsitarget.Nexus.LUNs: LUN masking and numbering; nil: all) when
	// its I_T nexus is created; Remap changes it later.
	LUNMap func(initiator srp.PortID) map[uint64]uint64
	// Budget bounds the I/O buffers of all channels together and each
	// I_T nexus's share (shared with the node's other fabrics); nil: 1
	// GiB, 128 MiB a nexus. A command that finds no room gets TASK SET
	// FULL.
	Budget *blockcore.IOBudget
	// RelativePort is the relative target port identifier reported in
	// VPD page 83h (default 2; the iSCSI portal group is 1).
	RelativePort uint16
	Logger       *slog.Logger
}

// Largest data transfer of one command.
const maxTransfer = 64 << 20

// Server is an SRP target port.
type Server struct {
	opts    Options
	log     *slog.Logger
	pool    bufpool.Pool
	port    srp.PortID
	formats uint16

	mu       sync.Mutex
	nexuses  map[srp.PortID]*nexus
	lastID   int // last nexus id given
	channels map[*channel]struct{}
	reserved int // channels being set up
	// from counts the channels of each source address, set up or being
	// set up (Options.MaxChannelsPerSource).
	from   persource.Counts[string]
	own    []*Ports // the listeners of Serve, each with this port alone
	closed bool
	wg     sync.WaitGroup

	refused persource.Refusals // logins rejected for the channel bounds (BoundsHit)
}

// nexus is one I_T nexus: an initiator port's channels to this target
// port share its unit attentions and task sets.
type nexus struct {
	id int // for SessionInfo ("srp-N")
	n  *scsitarget.Nexus
	// channels is changed under Server.mu and nexus.mu, read under
	// either: the unit attention hook runs under the core's callers'
	// locks and takes only nexus.mu.
	mu       sync.Mutex
	channels map[*channel]struct{}
	// io is the nexus's share of the I/O buffer budget.
	io *blockcore.IOShare
}

// unitAttention announces a unit attention on every channel of the nexus
// with SRP_AER_REQ (SRP r16a: asynchronous event reporting).
func (nx *nexus) unitAttention(lun uint64, s scsi.Sense) {
	for _, ch := range nx.channelList() {
		ch.sendAER(lun, &s)
	}
}

// channelList returns the nexus's channels (taking nexus.mu).
func (nx *nexus) channelList() []*channel {
	nx.mu.Lock()
	defer nx.mu.Unlock()
	chans := make([]*channel, 0, len(nx.channels))
	for ch := range nx.channels {
		chans = append(chans, ch)
	}
	return chans
}

// New returns a target port serving opts.Device.
func New(opts Options) *Server {
	if opts.Credits <= 0 {
		opts.Credits = 128
	}
	if opts.MaxITIULen <= 0 {
		opts.MaxITIULen = 65536 + 68
	}
	opts.MaxITIULen = max(opts.MaxITIULen, srp.MinITIULen)
	if opts.MaxChannels <= 0 {
		opts.MaxChannels = 64
	}
	if opts.MaxChannelsPerSource <= 0 {
		opts.MaxChannelsPerSource = 16
	}
	if opts.MaxDescriptors <= 0 {
		opts.MaxDescriptors = 32
	}
	if opts.Budget == nil {
		opts.Budget = blockcore.NewIOBudget(1<<30, 128<<20)
	}
	if opts.RelativePort == 0 {
		opts.RelativePort = 2
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, log: opts.Logger, port: srp.MakePortID(opts.IDExt, opts.IOCGUID),
		nexuses: map[srp.PortID]*nexus{}, channels: map[*channel]struct{}{}}
	if opts.Memory != nil {
		s.pool.Source = opts.Memory
	}
	s.formats = srp.BufDirect | srp.BufIndirect
	if !opts.NoImmediate {
		s.formats |= srp.BufImmediate
	}
	return s
}

// PortID returns the target port ID logins must name.
func (s *Server) PortID() srp.PortID { return s.port }

// Serve accepts logins on ln until ln or the server is closed: this
// target port alone on a listener of its own (Ports serves several on
// shared listeners).
func (s *Server) Serve(ln rdma.Listener) error {
	p := NewPorts(s.log)
	p.Add(s)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return errors.New("srp: server closed")
	}
	s.own = append(s.own, p)
	s.mu.Unlock()
	return p.Serve(ln)
}

// Close logs every channel out (SRP_T_LOGOUT), stops the listeners Serve
// runs on and waits for the channels to end.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	chans := make([]*channel, 0, len(s.channels))
	for ch := range s.channels {
		chans = append(chans, ch)
	}
	own := s.own
	s.own = nil
	s.mu.Unlock()
	for _, p := range own {
		p.Close() // logins being routed see closed and are rejected
	}
	for _, ch := range chans {
		ch.logout(srp.LogoutNoReason, errors.New("target shutting down"))
	}
	s.wg.Wait()
	return nil
}

// Sessions describes the I_T nexuses, each with its channels
// (scsitarget.SessionInfo, fabric "srp", ID "srp-N").
func (s *Server) Sessions() []scsitarget.SessionInfo {
	s.mu.Lock()
	nxs := make([]*nexus, 0, len(s.nexuses))
	for _, nx := range s.nexuses {
		nxs = append(nxs, nx)
	}
	s.mu.Unlock()
	slices.SortFunc(nxs, func(a, b *nexus) int { return a.id - b.id })
	out := make([]scsitarget.SessionInfo, 0, len(nxs))
	for _, nx := range nxs {
		si := scsitarget.SessionInfo{Fabric: "srp", ID: "srp-" + strconv.Itoa(nx.id), Target: s.opts.Device.Name(),
			Initiator: nx.n.InitiatorPort, Stats: nx.n.Stats(),
			Params: map[string]string{"TargetPort": s.port.String(), "Credits": strconv.Itoa(s.opts.Credits)}}
		for i, ch := range nx.channelList() {
			ch.mu.Lock()
			n := ch.live
			ch.mu.Unlock()
			si.Conns = append(si.Conns, scsitarget.ConnInfo{ID: strconv.Itoa(i), Remote: ch.remote, Transport: "srp", InFlight: n})
		}
		out = append(out, si)
	}
	return out
}

// DropSession logs out every channel of the nexus whose ID
// (scsitarget.SessionInfo) is id; the initiator may log in again.
func (s *Server) DropSession(id string) bool {
	s.mu.Lock()
	var chans []*channel
	for _, nx := range s.nexuses {
		if "srp-"+strconv.Itoa(nx.id) == id {
			chans = nx.channelList()
		}
	}
	s.mu.Unlock()
	for _, ch := range chans {
		ch.logout(srp.LogoutNoReason, errors.New("dropped by the administrator"))
	}
	return len(chans) > 0
}

// Remap gives the I_T nexus of initiator port id its new view of the LUNs
// (scsitarget.Device.SetNexusLUNs: nil, every LUN) at once — its ACL
// entry's LUN map changed; the initiator is told by REPORTED LUNS DATA
// HAS CHANGED (and an SRP_AER_REQ). It reports whether the nexus exists.
func (s *Server) Remap(id srp.PortID, view map[uint64]uint64) bool {
	s.mu.Lock()
	nx := s.nexuses[id]
	s.mu.Unlock()
	if nx == nil {
		return false
	}
	s.opts.Device.SetNexusLUNs(nx.n, view)
	return true
}

// Channels returns the number of live RDMA channels.
func (s *Server) Channels() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.channels)
}

func (s *Server) reject(req rdma.ConnRequest, lr *srp.LoginReq, reason srp.RejectReason, format string, a ...any) {
	s.log.Warn("srp: login rejected", "remote", req.RemoteAddr(), "initiator", lr.Initiator, "reason", reason.String(),
		"detail", fmt.Sprintf(format, a...))
	rej := srp.LoginRej{Reason: reason, Tag: lr.Tag, BufFormats: s.formats}
	if rr, ok := req.(rdma.ReasonRejecter); ok && reason == srp.RejectChannelLimit {
		// The SRP InfiniBand annex §A.4: more hosts than the controller has QPs — the
		// InfiniBand CM's REJ reason 1, no QP available (with the
		// SRP_LOGIN_REJ still in the private data).
		_ = rr.RejectReason(rdma.RejectNoQP, "SRP channel limit reached", rej.Append(nil))
		return
	}
	_ = req.Reject(rej.Append(nil))
}

// decodeLogin decodes the SRP_LOGIN_REQ a connection request carries.
func decodeLogin(req rdma.ConnRequest, lr *srp.LoginReq) error {
	decode := lr.DecodeCM
	if c, ok := req.(rdma.CMPortSpace); ok && !c.RDMACM() {
		// An InfiniBand CM REQ to the I/O controller's own service ID
		// carries the whole 64-byte SRP_LOGIN_REQ (the SRP InfiniBand annex §A.2).
		decode = lr.Decode
	}
	return decode(req.PrivateData())
}

// admit sets up the channel of a decoded login, or rejects it.
func (s *Server) admit(req rdma.ConnRequest, lr0 *srp.LoginReq) {
	lr := *lr0
	switch {
	case lr.MaxITIULen < srp.MinITIULen:
		s.reject(req, &lr, srp.RejectITIULen, "requested I→T IU length %d is below %d", lr.MaxITIULen, srp.MinITIULen)
		return
	case lr.BufFormats&^s.formats != 0:
		s.reject(req, &lr, srp.RejectBufferFormat, "required buffer formats %#x, supported %#x", lr.BufFormats, s.formats)
		return
	case lr.Target != s.port:
		s.reject(req, &lr, srp.RejectAssociate, "target port ID %v is not this target's %v", lr.Target, s.port)
		return
	case s.opts.Allow != nil && !s.opts.Allow(lr.Initiator, req.RemoteAddr()):
		s.reject(req, &lr, srp.RejectAssociate, "initiator port not admitted")
		return
	case lr.MultiChannel > srp.MultiChannelMulti:
		s.reject(req, &lr, srp.RejectUnable, "MULTI-CHANNEL ACTION %d is reserved", lr.MultiChannel)
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.reject(req, &lr, srp.RejectUnable, "target shutting down")
		return
	}
	if len(s.channels)+s.reserved >= s.opts.MaxChannels {
		s.mu.Unlock()
		s.refused.Refused(true)
		s.reject(req, &lr, srp.RejectChannelLimit, "%d channels already", s.opts.MaxChannels)
		return
	}
	src := s.opts.Sources.Of(req.RemoteAddr())
	if !s.from.Take(src, s.opts.MaxChannelsPerSource) {
		s.mu.Unlock()
		s.refused.Refused(false)
		s.reject(req, &lr, srp.RejectChannelLimit, "%d channels from %s already (the limit)", s.opts.MaxChannelsPerSource, src)
		return
	}
	s.reserved++
	var existing []*channel
	if nx := s.nexuses[lr.Initiator]; nx != nil {
		existing = nx.channelList()
	}
	s.mu.Unlock()

	maxIT := min(int(lr.MaxITIULen), s.opts.MaxITIULen)
	// Immediate data must start past the fixed IU and a descriptor, and
	// leave room in the IU (SRP-2).
	imm := !s.opts.NoImmediate && lr.Immediate &&
		int(lr.ImmDataOffset) >= srp.CmdLen+srp.ImmediateLen && int(lr.ImmDataOffset) < maxIT
	ch := newChannel(s, &lr, maxIT, imm, req)
	if ch == nil {
		s.mu.Lock()
		s.reserved--
		s.from.Give(src)
		s.mu.Unlock()
		s.reject(req, &lr, srp.RejectResources, "the RDMA device's registered memory is spent (rdma_memory)")
		return
	}
	mc := uint8(srp.MultiChanNoExisting)
	if len(existing) > 0 {
		mc = srp.MultiChanMaintained
		if lr.MultiChannel == srp.MultiChannelSingle {
			mc = srp.MultiChanTerminated
		}
	}
	rsp := srp.LoginRsp{ReqLimDelta: uint32(s.opts.Credits), Tag: lr.Tag, MaxITIULen: uint32(maxIT),
		MaxTIIULen: uint32(maxTI), BufFormats: s.formats, MultiChannel: mc, Immediate: imm}
	depth := (s.opts.Credits+extraRecvs)*2*(s.opts.MaxDescriptors+1) + 8
	qp, err := req.Accept(rdma.ConnParams{PD: s.opts.PD,
		QP:          rdma.QPConfig{SendCQ: ch.cq, RecvCQ: ch.cq, SendDepth: depth, RecvDepth: len(ch.slots)},
		PrivateData: rsp.Append(nil), Recvs: ch.recvs()})
	s.mu.Lock()
	s.reserved--
	if err != nil {
		s.from.Give(src)
		s.mu.Unlock()
		ch.freeMemory()
		s.log.Warn("srp: accepting a login failed", "remote", req.RemoteAddr(), "err", err)
		return
	}
	// Closed meanwhile: the channel is set up all the same and logged out
	// below, so the initiator learns why (SRP_T_LOGOUT).
	closing := s.closed
	nx := s.nexuses[lr.Initiator]
	if nx == nil {
		var view map[uint64]uint64
		if s.opts.LUNMap != nil {
			view = s.opts.LUNMap(lr.Initiator)
		}
		s.lastID++
		nx = &nexus{id: s.lastID, n: &scsitarget.Nexus{InitiatorPort: lr.Initiator.String(), TargetPort: s.port.String(), RelativePort: s.opts.RelativePort, LUNs: view},
			channels: map[*channel]struct{}{}, io: s.opts.Budget.NewShare(src)}
		nx.n.OnUnitAttention = nx.unitAttention
		s.nexuses[lr.Initiator] = nx
		s.opts.Device.AddNexus(nx.n)
	}
	ch.qp, ch.nx, ch.source = qp, nx, src
	nx.mu.Lock()
	nx.channels[ch] = struct{}{}
	nx.mu.Unlock()
	s.channels[ch] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	ch.log.Info("srp: channel up", "credits", s.opts.Credits, "max_it_iu", maxIT, "immediate", imm,
		"multichannel", lr.MultiChannel, "existing", len(existing))
	if closing {
		ch.logout(srp.LogoutNoReason, errors.New("target shutting down"))
	}
	if lr.MultiChannel == srp.MultiChannelSingle {
		// SINGLE: the nexus's other channels are logged out.
		for _, old := range existing {
			old.logout(srp.LogoutMultiChannel, errors.New("a new login asked for a single channel"))
		}
	}
	go func() {
		defer s.wg.Done()
		ch.run()
	}()
}

// BoundsHit counts the logins rejected for the channel bounds: all the
// target's (channels, Options.MaxChannels) and one address's
// (channels_per_source).
func (s *Server) BoundsHit() map[string]uint64 {
	return s.refused.Hits("channels", "channels_per_source")
}

// leave removes a finished channel; the last channel of a nexus ends it.
func (s *Server) leave(ch *channel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.channels[ch]; ok {
		s.from.Give(ch.source)
	}
	delete(s.channels, ch)
	nx := ch.nx
	nx.mu.Lock()
	delete(nx.channels, ch)
	empty := len(nx.channels) == 0
	nx.mu.Unlock()
	if empty && s.nexuses[ch.initiator] == nx {
		delete(s.nexuses, ch.initiator)
		s.opts.Device.RemoveNexus(nx.n)
		nx.io.Close()
	}
}

// ---- channels ----

// Receive buffers beyond the credits: room for SRP_CRED_RSP and
// SRP_AER_RSP (which need no credit) and for noticing an initiator that
// sends more requests than its credits allow.
const extraRecvs = 2

// maxTI is the longest IU we send: SRP_RSP with 4 bytes of response data
// and the longest sense data the core produces.
var maxTI = srp.RspLen + 4 + len(scsitarget.Command{}.Sense)

// Send work request kinds (low byte of the ID; the task index above it).
const (
	kindRead   = 1 // last RDMA Read of a task's data-out
	kindTable  = 2 // RDMA Read of an external descriptor table
	kindRsp    = 3 // SRP_RSP
	kindWrite  = 4 // RDMA Write of data-in (unsignaled)
	kindCtl    = 5 // SRP_CRED_REQ or SRP_T_LOGOUT (no task)
	kindLogout = 6
)

type channel struct {
	s         *Server
	log       *slog.Logger
	qp        rdma.QP
	cq        *rdma.CQ
	nx        *nexus
	fulls     atomic.Int64  // commands answered TASK SET FULL
	tmfs      atomic.Uint64 // task management functions run, for their log
	initiator srp.PortID
	remote    string
	source    string // remote's address, for Options.MaxChannelsPerSource
	maxIT     int
	immOff    int // 0 without immediate data
	credits   int

	mem   []byte // ring and the tasks' responses, registered on a kernel device
	ring  []byte // receive buffers, maxIT bytes each
	slots []rdma.RecvWR
	tasks []task
	free  []int32 // free task indexes (under mu)

	held  atomic.Int32 // receive buffers holding a request
	delta atomic.Int32 // receive buffers posted again, credit not yet returned

	mu       sync.Mutex
	byTag    map[uint64]*task
	closing  bool
	live     int // tasks not yet released
	credReqs int // SRP_CRED_REQs not yet answered
	aerOut   bool
	aerTag   uint64
	ctlBuf   [srp.TLogoutLen]byte
	credBuf  [srp.CredReqLen]byte
	aerBuf   [srp.AerReqLen + 252]byte
	stopOnce sync.Once
	logoutCh chan struct{}
}

// rspLen is room for an SRP_RSP with the longest sense data.
const rspLen = srp.RspLen + 4 + len(scsitarget.Command{}.Sense)

// newChannel prepares a channel, or returns nil when the device's
// registered memory cannot hold its receive buffers and responses: on a
// kernel RDMA device they live there for the channel's life, so that
// what the initiator sends and every answer move without a bounce, which
// needs registered memory too (a login refused then is one the initiator
// can report; a channel without them answered nothing once the budget
// was spent).
func newChannel(s *Server, lr *srp.LoginReq, maxIT int, imm bool, req rdma.ConnRequest) *channel {
	n := s.opts.Credits + extraRecvs
	size := n*maxIT + 2*n*rspLen
	var mem []byte
	if m := s.opts.PD.Memory(); m != nil {
		b, ok := m.Alloc(size)
		if !ok {
			return nil
		}
		mem = b
	} else {
		mem = make([]byte, size)
	}
	ch := &channel{s: s, initiator: lr.Initiator, maxIT: maxIT, credits: s.opts.Credits, mem: mem,
		cq: rdma.NewCQ(4 * n), ring: mem[:n*maxIT], slots: make([]rdma.RecvWR, n),
		tasks: make([]task, 2*n), byTag: map[uint64]*task{}, logoutCh: make(chan struct{})}
	rsps := mem[n*maxIT:]
	for i := range ch.tasks {
		ch.tasks[i].rsp = rsps[i*rspLen : (i+1)*rspLen : (i+1)*rspLen]
	}
	ch.remote = req.RemoteAddr().String()
	ch.log = s.log.With("initiator", lr.Initiator.String(), "remote", ch.remote)
	if imm {
		ch.immOff = int(lr.ImmDataOffset)
	}
	for i := range ch.slots {
		ch.slots[i] = rdma.RecvWR{ID: uint64(i), Buf: ch.ring[i*maxIT : (i+1)*maxIT]}
	}
	for i := len(ch.tasks) - 1; i >= 0; i-- {
		ch.tasks[i].ch, ch.tasks[i].idx = ch, int32(i)
		ch.free = append(ch.free, int32(i))
	}
	return ch
}

func (ch *channel) recvs() []rdma.RecvWR { return append([]rdma.RecvWR(nil), ch.slots...) }

// freeMemory gives the channel's buffers back to the device, once its
// queue pair is closed (nothing can land in them any more).
func (ch *channel) freeMemory() {
	if m := ch.s.opts.PD.Memory(); m != nil {
		m.Free(ch.mem)
	}
	ch.mem, ch.ring = nil, nil
}

// run is the channel's completion loop: receives and send completions
// come through one CQ and are handled here, in order.
func (ch *channel) run() {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-ch.qp.Done()
		cancel()
	}()
	var comps [32]rdma.Completion
	for {
		n, err := ch.cq.Wait(ctx, comps[:])
		if err != nil {
			// The queue pair is down: everything it still held has been
			// flushed into the CQ before Done closed.
			n = ch.cq.Poll(comps[:])
			if n == 0 {
				break
			}
		}
		for i := range comps[:n] {
			ch.completion(&comps[i])
		}
	}
	ch.mu.Lock()
	ch.closing = true
	ch.mu.Unlock()
	if err := ch.qp.Err(); err != nil {
		ch.log.Info("srp: channel down", "err", err)
	} else {
		ch.log.Info("srp: channel closed")
	}
	// Tasks still executing in the core finish without a response. What
	// they post on the dead queue pair comes back flushed, and a kernel
	// device delivers flushes after Done too: completions are still taken
	// until the last task has ended (a task whose flushed response nobody
	// took kept the channel, and the node's shutdown, waiting for ever).
	for {
		ch.mu.Lock()
		live := ch.live
		ch.mu.Unlock()
		if live == 0 {
			break
		}
		wctx, wcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		n, _ := ch.cq.Wait(wctx, comps[:])
		wcancel()
		for i := range comps[:n] {
			ch.completion(&comps[i])
		}
	}
	// The queue pair is given back now, whoever ended the channel: a
	// kernel device frees a queue pair and its registered memory only
	// when it is closed, and a peer that disconnects closes nothing of
	// ours (each ib_srp login left one behind until exit).
	ch.qp.Close()
	// The tasks' regions go back to the device (their sinks: nothing can
	// reach them with the queue pair closed).
	for i := range ch.tasks {
		if mr := ch.tasks[i].mr; mr != nil {
			mr.Deregister()
			ch.tasks[i].mr = nil
		}
	}
	ch.freeMemory()
	ch.s.leave(ch)
	cancel()
}

func (ch *channel) completion(c *rdma.Completion) {
	if c.Op == rdma.OpRecv {
		if c.Status != rdma.Success {
			return // flushed
		}
		ch.receive(int(c.ID), ch.slots[c.ID].Buf[:c.Len])
		return
	}
	kind := c.ID & 0xff
	if kind == kindCtl || kind == kindLogout {
		if kind == kindLogout {
			ch.stopOnce.Do(func() { close(ch.logoutCh) })
		}
		return
	}
	t := &ch.tasks[c.ID>>8]
	if c.Status != rdma.Success {
		if c.Status != rdma.Flushed {
			ch.log.Warn("srp: work request failed", "op", c.Op, "status", c.Status, "tag", t.tag, "err", ch.qp.Err())
		}
		ch.mu.Lock()
		t.aborted = true
		ch.mu.Unlock()
		if kind == kindRsp || kind == kindRead || kind == kindTable {
			ch.release(t)
		}
		return
	}
	switch kind {
	case kindRead:
		ch.fetched(t)
	case kindTable:
		ch.tableFetched(t)
	case kindRsp:
		ch.release(t)
	}
}

// receive handles one IU in receive buffer slot.
func (ch *channel) receive(slot int, iu []byte) {
	op := srp.Op(iu)
	switch op {
	case srp.OpCmd, srp.OpTskMgmt:
		if ch.held.Add(1) > int32(ch.credits) {
			ch.logout(srp.LogoutNoReason, fmt.Errorf("%v beyond the request limit of %d", op, ch.credits))
			return
		}
		ch.mu.Lock()
		if len(ch.free) == 0 {
			ch.mu.Unlock()
			ch.logout(srp.LogoutNoReason, errors.New("no task slot free"))
			return
		}
		t := &ch.tasks[ch.free[len(ch.free)-1]]
		ch.free = ch.free[:len(ch.free)-1]
		ch.live++
		ch.mu.Unlock()
		t.reset(slot, iu)
		if op == srp.OpCmd {
			ch.command(t)
		} else {
			ch.taskMgmt(t)
		}
	case srp.OpILogout:
		ch.log.Info("srp: initiator logged out")
		go ch.qp.Close()
	case srp.OpCredRsp:
		ch.mu.Lock()
		ok := ch.credReqs > 0
		if ok {
			ch.credReqs--
		}
		ch.mu.Unlock()
		if !ok {
			ch.logout(srp.LogoutSpuriousResponse, errors.New("SRP_CRED_RSP without a request"))
			return
		}
		ch.repost(slot, false)
	case srp.OpAerRsp:
		ch.mu.Lock()
		ok := ch.aerOut
		ch.aerOut = false
		ch.mu.Unlock()
		if !ok {
			ch.logout(srp.LogoutSpuriousResponse, errors.New("SRP_AER_RSP without a request"))
			return
		}
		ch.repost(slot, false)
	case srp.OpLoginReq:
		ch.logout(srp.LogoutInvalidIUType, errors.New("SRP_LOGIN_REQ on a live channel"))
	default:
		ch.logout(srp.LogoutInvalidIUType, fmt.Errorf("%v from the initiator", op))
	}
}

// repost gives receive buffer slot back to the queue pair; a request's
// buffer also earns back a credit for the next response.
func (ch *channel) repost(slot int, credit bool) {
	if err := ch.qp.PostRecv(ch.slots[slot]); err != nil {
		return // the channel is going down
	}
	if credit {
		ch.held.Add(-1)
		ch.delta.Add(1)
	}
}

// sendAER reports a unit attention with SRP_AER_REQ, one at a time (while
// one is unanswered, later ones are left to CHECK CONDITION).
func (ch *channel) sendAER(lun uint64, s *scsi.Sense) {
	ch.mu.Lock()
	if ch.closing || ch.aerOut || ch.qp == nil {
		ch.mu.Unlock()
		return
	}
	ch.aerOut = true
	ch.aerTag++
	var sense [252]byte
	lf := scsi.EncodeLUN(lun)
	ar := srp.AerReq{ReqLimDelta: ch.delta.Swap(0), Tag: ch.aerTag, LUN: binary.BigEndian.Uint64(lf[:]), Sense: s.AppendFixed(sense[:0])}
	b := ar.Append(ch.aerBuf[:0])
	ch.mu.Unlock()
	if err := ch.qp.PostSend(&rdma.SendWR{ID: kindCtl, Op: rdma.OpSend, SG: [][]byte{b}}); err != nil {
		ch.delta.Add(ar.ReqLimDelta)
	}
}

// logoutGrace bounds how long a channel being logged out waits for its
// SRP_T_LOGOUT to be sent. On a reliable connection a lost message is
// resent after the ACK timeout and acknowledged one later: Linux's rdma_cm
// asks for 4.096 µs × 2^17 ≈ 0.54 s on RoCE, and a retransmission timer
// that checks once per timeout resends after one to two of them. Four
// seconds cover two lost transmissions (as iSER's terminateGrace); a peer
// that never acknowledges holds a closing channel no longer.
const logoutGrace = 4 * time.Second

// logout sends SRP_T_LOGOUT with reason and closes the channel once it
// has been sent (or after logoutGrace).
func (ch *channel) logout(reason srp.LogoutReason, why error) {
	ch.mu.Lock()
	if ch.closing {
		ch.mu.Unlock()
		return
	}
	ch.closing = true
	ch.mu.Unlock()
	lvl := slog.LevelWarn
	if reason == srp.LogoutNoReason || reason == srp.LogoutMultiChannel {
		lvl = slog.LevelInfo
	}
	ch.log.Log(context.Background(), lvl, "srp: logging the channel out", "reason", reason.String(), "why", why)
	tl := srp.TLogout{Reason: reason}
	b := tl.Append(ch.ctlBuf[:0])
	if ch.qp.PostSend(&rdma.SendWR{ID: kindLogout, Op: rdma.OpSend, Solicited: true, SG: [][]byte{b}}) == nil {
		go func() {
			select {
			case <-ch.logoutCh:
			case <-ch.qp.Done():
			case <-time.After(logoutGrace):
			}
			ch.qp.Close()
		}()
		return
	}
	go ch.qp.Close()
}
