// Package srpinitiator is the SRP initiator: it logs in to an SRP target
// through the rdma connection manager (the 56-byte RDMA/CM login, as Linux
// ib_srp sends it), registers each command's buffer for the target's RDMA
// Reads and Writes (VA-based addresses, a fast-registered memory region
// per request), honours the target's request limit (credits), answers
// SRP_CRED_REQ and SRP_AER_REQ, and aborts commands whose context ends
// with SRP_TSK_MGMT ABORT TASK. Open gives the same block-device view as
// the iSCSI initiator (package blockdev).
package srpinitiator

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/blockwire/blockwire/blockdev"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/srp"
)

// Options configure a login.
type Options struct {
	// Fabric connects (for example rdma/siw).
	Fabric rdma.Fabric
	// PD holds the queue pair and the memory regions; by default a new
	// software device's.
	PD *rdma.PD
	// Initiator is the initiator port ID (default: a random initiator
	// extension and a fixed GUID half).
	Initiator srp.PortID
	// MaxITIULen is the I→T IU length asked for (default 8260: SRP_CMD
	// with immediate data of up to 8 KiB at offset 68, as Linux does).
	MaxITIULen int
	// NoImmediate never sends immediate data.
	NoImmediate bool
	// MultiChannel asks to keep the nexus's other channels
	// (srp.MultiChannelMulti) instead of replacing them.
	MultiChannel uint8
	// MaxOutstanding bounds the commands in flight (default 128, and
	// never more than the target's credits allow).
	MaxOutstanding int
	// ServiceID, on an InfiniBand CM fabric, connects to this I/O
	// controller service ID (the SRP InfiniBand annex §A.2) with the 64-byte
	// SRP_LOGIN_REQ as the REQ's private data, instead of through RDMA/CM's
	// port space with its 56-byte form. The address's port is ignored.
	ServiceID uint64
	// OnEvent, if set, is told of each asynchronous event the target
	// reports (SRP_AER_REQ: a unit attention and its sense data).
	OnEvent func(lun uint64, s *scsi.Sense)
	Logger  *slog.Logger
}

// Linux ib_srp's immediate-data offset: after SRP_CMD and an indirect
// descriptor header.
const immOffset = srp.CmdLen + srp.IndirectLen

// recvSize is the receive buffer for target IUs: SRP_RSP with sense data,
// AER_REQ, CRED_REQ, T_LOGOUT.
const recvSize = 1024

// Channel is one logged-in RDMA channel to an SRP target.
type Channel struct {
	opts  Options
	log   *slog.Logger
	qp    rdma.QP
	pd    *rdma.PD
	cq    *rdma.CQ
	ring  []byte
	slots []rdma.RecvWR
	maxIT int
	imm   bool

	mu      sync.Mutex
	cond    *sync.Cond
	reqLim  int // credits
	reqs    []*request
	free    []int
	err     error
	closing bool
	ctlBuf  [srp.TskMgmtLen]byte
	done    chan struct{}
	wg      sync.WaitGroup
}

// request is one command (or task management function) in flight.
type request struct {
	idx  int
	gen  uint32
	mr   *rdma.MR
	iu   []byte // send buffer, maxIT bytes
	done chan struct{}
	// the response, copied out of the receive buffer
	rsp   srp.Rsp
	sense [256]byte
	resp  [4]byte
	got   bool
	sg    [1][]byte
	wr    rdma.SendWR // PostSend copies it
}

// Dial logs in to the SRP target at addr whose port ID is tgt.
func Dial(ctx context.Context, addr string, tgt srp.PortID, opts Options) (*Channel, error) {
	if opts.Fabric == nil {
		return nil, errors.New("srp: no RDMA fabric")
	}
	if opts.PD == nil {
		opts.PD = rdma.FabricPD(opts.Fabric, "blockwire-srp")
	}
	if opts.Initiator == (srp.PortID{}) {
		var ext [8]byte
		rand.Read(ext[:])
		opts.Initiator = srp.MakePortID(binary.BigEndian.Uint64(ext[:]), 0x0002c90300b10c6b)
	}
	if opts.MaxITIULen <= 0 {
		opts.MaxITIULen = immOffset + 8192
	}
	if opts.MaxOutstanding <= 0 {
		opts.MaxOutstanding = 128
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Channel{opts: opts, pd: opts.PD, log: opts.Logger.With("target", addr), done: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	// One receive per command in flight, and room for unsolicited IUs.
	n := opts.MaxOutstanding + 8
	c.cq = rdma.NewCQ(4 * n)
	c.ring = make([]byte, n*recvSize)
	c.slots = make([]rdma.RecvWR, n)
	for i := range c.slots {
		c.slots[i] = rdma.RecvWR{ID: uint64(i), Buf: c.ring[i*recvSize : (i+1)*recvSize]}
	}
	lr := srp.LoginReq{MaxITIULen: uint32(opts.MaxITIULen), BufFormats: srp.BufDirect | srp.BufIndirect,
		MultiChannel: opts.MultiChannel, Immediate: !opts.NoImmediate, ImmDataOffset: immOffset,
		Initiator: opts.Initiator, Target: tgt}
	if opts.NoImmediate {
		lr.ImmDataOffset = 0
	}
	cp := rdma.ConnParams{PD: c.pd,
		QP:          rdma.QPConfig{SendCQ: c.cq, RecvCQ: c.cq, SendDepth: 2 * n, RecvDepth: n},
		PrivateData: lr.AppendCM(nil), Recvs: append([]rdma.RecvWR(nil), c.slots...)}
	if opts.ServiceID != 0 {
		// The whole service ID: its high 48 bits as the base, its low 16
		// as the port.
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("srp: %w", err)
		}
		addr = net.JoinHostPort(host, strconv.Itoa(int(opts.ServiceID&0xffff)))
		cp.ServiceIDBase, cp.PrivateData = opts.ServiceID&^0xffff, lr.Append(nil)
	}
	qp, pd, err := opts.Fabric.Dial(ctx, addr, cp)
	if err != nil {
		var re *rdma.RejectError
		if errors.As(err, &re) {
			var rej srp.LoginRej
			if rej.Decode(re.PrivateData) == nil {
				return nil, &rej
			}
		}
		return nil, fmt.Errorf("srp: connecting to %s: %w", addr, err)
	}
	var rsp srp.LoginRsp
	if err := rsp.Decode(pd); err != nil {
		qp.Close()
		return nil, fmt.Errorf("srp: login response: %w", err)
	}
	if rsp.MaxITIULen < srp.MinITIULen {
		qp.Close()
		return nil, fmt.Errorf("srp: target's maximum I→T IU length %d is below %d", rsp.MaxITIULen, srp.MinITIULen)
	}
	// ib_srpt answers its own limit (8276 by default), which may exceed
	// what we asked for: use the smaller.
	rsp.MaxITIULen = min(rsp.MaxITIULen, lr.MaxITIULen)
	if rsp.ReqLimDelta == 0 {
		qp.Close()
		return nil, errors.New("srp: the target granted no credits")
	}
	c.qp = qp
	c.maxIT = int(rsp.MaxITIULen)
	c.imm = rsp.Immediate && !opts.NoImmediate && c.maxIT > immOffset
	c.reqLim = int(rsp.ReqLimDelta)
	c.reqs = make([]*request, min(opts.MaxOutstanding, c.reqLim)+1) // +1: a task management function
	for i := range c.reqs {
		// A window per request on a hardware device that has them: the
		// target reaches each I/O's buffer only while it runs.
		mr, err := c.pd.AllocMROn(qp)
		if err != nil {
			qp.Close()
			for _, q := range c.reqs[:i] {
				q.mr.Deregister()
			}
			return nil, err
		}
		c.reqs[i] = &request{idx: i, mr: mr, iu: make([]byte, c.maxIT), done: make(chan struct{}, 1)}
		if i > 0 {
			c.free = append(c.free, i) // request 0 is kept for task management
		}
	}
	c.log.Debug("srp: logged in", "credits", rsp.ReqLimDelta, "max_it_iu", rsp.MaxITIULen, "immediate", c.imm,
		"multichannel", rsp.MultiChannel)
	c.wg.Add(1)
	go c.run()
	return c, nil
}

// tag makes a request's tag: its index and a generation, so a late
// response to an aborted request cannot complete its successor.
func (r *request) tag() uint64 { return uint64(r.gen)<<32 | uint64(r.idx) }

// run handles completions: responses and unsolicited target IUs.
func (c *Channel) run() {
	defer c.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.qp.Done()
		cancel()
	}()
	var comps [32]rdma.Completion
	for {
		n, err := c.cq.Wait(ctx, comps[:])
		if err != nil {
			if n = c.cq.Poll(comps[:]); n == 0 {
				break
			}
		}
		for i := range comps[:n] {
			cp := &comps[i]
			if cp.Status != rdma.Success {
				if cp.Status != rdma.Flushed {
					c.fail(fmt.Errorf("srp: %v %v: %v", cp.Op, cp.Status, c.qp.Err()))
				}
				continue
			}
			if cp.Op == rdma.OpRecv {
				c.receive(c.slots[cp.ID].Buf[:cp.Len])
				_ = c.qp.PostRecv(c.slots[cp.ID])
			}
		}
	}
	err := c.qp.Err()
	if err == nil {
		err = errors.New("srp: channel closed")
	}
	c.fail(err)
}

// fail ends the channel: every waiting command returns err.
func (c *Channel) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
	c.cond.Broadcast()
	c.mu.Unlock()
}

func (c *Channel) receive(iu []byte) {
	switch srp.Op(iu) {
	case srp.OpRsp:
		var r srp.Rsp
		if err := r.Decode(iu); err != nil {
			c.fail(err)
			return
		}
		tag := r.Tag
		c.mu.Lock()
		c.reqLim += int(r.ReqLimDelta)
		c.cond.Broadcast()
		idx := int(uint32(tag))
		if idx >= len(c.reqs) || c.reqs[idx].tag() != tag || c.reqs[idx].got {
			c.mu.Unlock()
			c.log.Warn("srp: response for no outstanding request", "tag", tag)
			return
		}
		q := c.reqs[idx]
		q.rsp = r
		q.rsp.Sense = q.sense[:copy(q.sense[:], r.Sense)]
		q.rsp.RespData = q.resp[:copy(q.resp[:], r.RespData)]
		q.got = true
		c.mu.Unlock()
		q.done <- struct{}{}
	case srp.OpCredReq:
		var r srp.CredReq
		if err := r.Decode(iu); err != nil {
			c.fail(err)
			return
		}
		c.grant(r.ReqLimDelta)
		c.reply(srp.AppendCredRsp(nil, r.Tag))
	case srp.OpAerReq:
		var r srp.AerReq
		if err := r.Decode(iu); err != nil {
			c.fail(err)
			return
		}
		c.grant(r.ReqLimDelta)
		if s, err := scsi.ParseSense(r.Sense); err == nil {
			var lf [8]byte
			binary.BigEndian.PutUint64(lf[:], r.LUN)
			lun, _ := scsi.DecodeLUN(lf)
			c.log.Info("srp: asynchronous event", "lun", lun, "sense", s)
			if c.opts.OnEvent != nil {
				c.opts.OnEvent(lun, s)
			}
		}
		c.reply(srp.AppendAerRsp(nil, r.Tag))
	case srp.OpTLogout:
		var r srp.TLogout
		if err := r.Decode(iu); err != nil {
			// The channel ends either way; say why it could not be read.
			c.log.Warn("srp: the target logged the channel out with a malformed SRP_T_LOGOUT", "err", err)
			c.fail(fmt.Errorf("srp: target logout: %w", err))
			go c.qp.Close()
			return
		}
		c.log.Warn("srp: the target logged the channel out", "reason", r.Reason.String())
		c.fail(fmt.Errorf("srp: target logout: %v", r.Reason))
		go c.qp.Close()
	default:
		c.log.Warn("srp: unexpected IU from the target", "type", srp.Op(iu))
	}
}

// grant adds credits the target returned, or takes back those it took
// back (a negative delta).
func (c *Channel) grant(delta int32) {
	c.mu.Lock()
	c.reqLim += int(delta)
	c.cond.Broadcast()
	c.mu.Unlock()
}

// reply sends a CRED_RSP or AER_RSP (they need no credit).
func (c *Channel) reply(b []byte) {
	_ = c.qp.PostSend(&rdma.SendWR{ID: ^uint64(0), Op: rdma.OpSend, SG: [][]byte{b}, Unsignaled: true})
}

// acquire waits for a credit and a free request. One credit is kept for
// task management (as Linux ib_srp does).
func (c *Channel) acquire(ctx context.Context) (*request, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			c.mu.Lock()
			c.cond.Broadcast()
			c.mu.Unlock()
		})
		defer stop()
	}
	for {
		if c.err != nil {
			return nil, c.err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if c.reqLim > 1 && len(c.free) > 0 {
			break
		}
		c.cond.Wait()
	}
	c.reqLim--
	q := c.reqs[c.free[len(c.free)-1]]
	c.free = c.free[:len(c.free)-1]
	q.gen++
	q.got = false
	return q, nil
}

func (c *Channel) putRequest(q *request) {
	q.mr.Invalidate()
	c.mu.Lock()
	c.free = append(c.free, q.idx)
	c.cond.Broadcast()
	c.mu.Unlock()
}

// Do runs one SCSI command on lun. out is data-out, in data-in (at most
// one of them). A status other than GOOD returns a *blockdev.SCSIError.
func (c *Channel) Do(ctx context.Context, lun uint64, cdb []byte, out, in []byte) (blockdev.Result, error) {
	var res blockdev.Result
	if len(out) > 0 && len(in) > 0 {
		return res, errors.New("srp: bidirectional commands are not supported")
	}
	if len(cdb) > 16+252 {
		return res, fmt.Errorf("srp: %d-byte CDB", len(cdb))
	}
	q, err := c.acquire(ctx)
	if err != nil {
		return res, err
	}
	// VA-based tagged offsets (the iSER-on-InfiniBand draft): each request has its own range.
	va := uint64(0x7e0000000000) + uint64(q.idx)<<32
	cmd := srp.Cmd{Tag: q.tag(), LUN: lunField(lun), CDB: cdb}
	switch {
	case len(out) > 0 && c.imm && immOffset+len(out) <= c.maxIT:
		cmd.Out = srp.Immediate(out)
	case len(out) > 0:
		stag, err := q.mr.Map(out, va, rdma.RemoteRead)
		if err != nil {
			c.putRequest(q)
			return res, err
		}
		// A hardware device names the buffer by its own address.
		cmd.Out = srp.Direct(srp.Desc{VA: q.mr.VA(), Key: stag, Len: uint32(len(out))})
	case len(in) > 0:
		stag, err := q.mr.Map(in, va, rdma.RemoteWrite|rdma.LocalWrite)
		if err != nil {
			c.putRequest(q)
			return res, err
		}
		cmd.In = srp.Direct(srp.Desc{VA: q.mr.VA(), Key: stag, Len: uint32(len(in))})
	}
	iu, err := cmd.Append(q.iu[:0], immOffset)
	if err == nil && len(iu) > c.maxIT {
		err = fmt.Errorf("srp: a %d-byte SRP_CMD exceeds the target's %d", len(iu), c.maxIT)
	}
	if err != nil {
		c.putRequest(q)
		return res, err
	}
	q.sg[0] = iu
	q.wr = rdma.SendWR{ID: uint64(q.idx), Op: rdma.OpSend, SG: q.sg[:], Unsignaled: true}
	if err := c.qp.PostSend(&q.wr); err != nil {
		c.putRequest(q)
		return res, err
	}
	select {
	case <-q.done:
	case <-c.done:
		// The target can no longer touch our memory: the queue pair is gone.
		c.putRequest(q)
		return res, c.err
	case <-ctx.Done():
		if err := c.abort(q, lun); err != nil {
			c.Close()
			return res, fmt.Errorf("srp: %w (and the abort failed: %v)", ctx.Err(), err)
		}
		c.putRequest(q)
		return res, ctx.Err()
	}
	r := &q.rsp
	res.Status = r.Status
	if len(out) > 0 {
		res.Residual = r.DataOutResidual()
	} else {
		res.Residual = r.DataInResidual()
		res.In = min(len(in), max(0, len(in)-res.Residual))
	}
	if len(r.Sense) > 0 {
		if s, err := scsi.ParseSense(r.Sense); err == nil {
			res.Sense = s
		}
	}
	c.putRequest(q)
	if res.Status != scsi.StatusGood {
		return res, &blockdev.SCSIError{Status: res.Status, Sense: res.Sense}
	}
	return res, nil
}

// abort sends ABORT TASK for q and waits for its answer; afterwards the
// target no longer touches q's memory (SAM-5 §7.2).
func (c *Channel) abort(q *request, lun uint64) error {
	c.mu.Lock()
	for c.reqLim < 1 && c.err == nil {
		c.cond.Wait()
	}
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	c.reqLim--
	m := c.reqs[0]
	m.gen++
	m.got = false
	tm := srp.TskMgmt{Tag: m.tag(), LUN: lunField(lun), Function: srp.TMFAbortTask, TaskTag: q.tag()}
	b := tm.Append(m.iu[:0])
	c.mu.Unlock()
	if err := c.qp.PostSend(&rdma.SendWR{ID: 0, Op: rdma.OpSend, SG: [][]byte{b}, Unsignaled: true}); err != nil {
		return err
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-m.done:
	case <-c.done:
		return c.err
	case <-t.C:
		return errors.New("no answer to ABORT TASK in 10 s")
	}
	if len(m.rsp.RespData) == 4 && m.rsp.RespData[3] != srp.TMFComplete && m.rsp.RespData[3] != srp.TMFSucceeded {
		return fmt.Errorf("ABORT TASK answered %#02x", m.rsp.RespData[3])
	}
	// A response that raced the abort is consumed here.
	select {
	case <-q.done:
	default:
	}
	return nil
}

func lunField(lun uint64) uint64 {
	b := scsi.EncodeLUN(lun)
	return binary.BigEndian.Uint64(b[:])
}

// Close logs out (SRP_I_LOGOUT) and disconnects.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		c.wg.Wait()
		return nil
	}
	c.closing = true
	alive := c.err == nil
	c.mu.Unlock()
	if alive {
		lo := srp.ILogout{}
		b := lo.Append(c.ctlBuf[:0])
		if c.qp.PostSend(&rdma.SendWR{ID: ^uint64(1), Op: rdma.OpSend, SG: [][]byte{b}}) == nil {
			select {
			case <-c.done:
			case <-time.After(time.Second):
			}
		}
	}
	c.qp.Close()
	c.wg.Wait()
	// Nothing reaches the requests' regions now: their indexes go back
	// to the device (each channel left one per request registered).
	for _, q := range c.reqs {
		q.mr.Deregister()
	}
	return nil
}

// Attr describes the queue pair.
func (c *Channel) Attr() rdma.QPAttr { return c.qp.Attr() }

// URL is a parsed srp://host:port/ID_EXT[:IOC_GUID]/LUN address: the
// target port ID is ID_EXT then IOC_GUID (16 hex digits each; IOC_GUID
// defaults to ID_EXT, which is how Linux ib_srpt names its port).
type URL struct {
	Addr   string
	Target srp.PortID
	LUN    uint64
	// Initiator is the initiator port ID the URL asks for
	// (?initiator=HI:LO or 32 hex digits); zero: Options.Initiator.
	Initiator srp.PortID
}

// DefaultPort is the port blockwire's SRP target listens on by default
// (ib_srpt's rdma_cm_port has no default; the guest lab uses 5555).
const DefaultPort = 5555

// ParseURL parses an srp:// URL.
func ParseURL(raw string) (*URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "srp" {
		return nil, fmt.Errorf("srp URL %q: scheme must be srp", raw)
	}
	host := u.Host
	if u.Port() == "" {
		host = strings.TrimSuffix(strings.TrimPrefix(u.Hostname(), "["), "]")
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
		host += ":" + strconv.Itoa(DefaultPort)
	}
	if h, port, err := net.SplitHostPort(host); err != nil || h == "" {
		return nil, fmt.Errorf("srp URL %q: needs a host (srp://HOST[:PORT]/…)", raw)
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("srp URL %q: port %q is not 1 to 65535", raw, port)
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if len(parts) != 2 || parts[0] == "" {
		return nil, fmt.Errorf("srp URL %q: needs /ID_EXT[:IOC_GUID]/LUN", raw)
	}
	idExt, ioc, ok := strings.Cut(parts[0], ":")
	if !ok {
		ioc = idExt
	}
	hi, err1 := strconv.ParseUint(strings.TrimPrefix(idExt, "0x"), 16, 64)
	lo, err2 := strconv.ParseUint(strings.TrimPrefix(ioc, "0x"), 16, 64)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("srp URL %q: the target port is ID_EXT[:IOC_GUID] in hex", raw)
	}
	lun, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil || lun >= 1<<14 {
		return nil, fmt.Errorf("srp URL %q: bad LUN %q", raw, parts[1])
	}
	out := &URL{Addr: host, Target: srp.MakePortID(hi, lo), LUN: lun}
	for k, v := range u.Query() {
		if k != "initiator" || len(v) != 1 {
			return nil, fmt.Errorf("srp URL %q: unknown parameter %q (only initiator=PORT_ID)", raw, k)
		}
		if out.Initiator, err = srp.ParsePortID(v[0]); err != nil {
			return nil, fmt.Errorf("srp URL %q: %w", raw, err)
		}
	}
	return out, nil
}

// Device is a block-device view of one LUN over an SRP channel.
type Device struct {
	*blockdev.Device
	ch *Channel
}

// Open logs in to the target of an srp:// URL and returns its LUN as a
// block device.
func Open(ctx context.Context, raw string, opts Options) (*Device, error) {
	u, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	if u.Initiator != (srp.PortID{}) {
		opts.Initiator = u.Initiator
	}
	ch, err := Dial(ctx, u.Addr, u.Target, opts)
	if err != nil {
		return nil, err
	}
	// 512 KiB per command, as Linux ib_srp's default max_sect (1024).
	bd, err := blockdev.Open(ctx, ch, "srp", u.LUN, 512<<10)
	if err != nil {
		ch.Close()
		return nil, err
	}
	return &Device{Device: bd, ch: ch}, nil
}

// Channel returns the underlying channel.
func (d *Device) Channel() *Channel { return d.ch }
