package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/nvme/tcphost"
	"github.com/blockwire/blockwire/scsi"
)

// Over NVMe/TCP (Config.Fabric "nvme") each client is a host with one
// controller (an admin and one I/O queue) asking for keep-alive timeout
// nvmeKATO. A controller that failed is closed and a new one made: the
// target does not end the old controller's commands for it as a
// reinstated iSCSI session ends its tasks, but it ends a controller it
// has lost within its keep-alive timeout, and its commands with it — so
// a command that failed may take effect up to nvmeQuiesce after the
// host saw it fail, never later (the checker holds the target to it).
const (
	nvmeKATO    = 3 * time.Second
	nvmeQuiesce = nvmeKATO + time.Second
)

// client is one initiator session doing operations.
type client struct {
	id  int
	cfg *Config
	rng *rand.Rand
	now func() int64
	rec *recorder
	seq uint64
	s   *initiator.Session
	nv  *tcphost.Controller // over NVMe/TCP, instead of s
	// targets are the addresses of every target (gateway), home is the
	// one the client logs in to (the others are its failover paths).
	targets []string
	home    int
	pr      bool // reservations in play: register on every session
	nexus   int  // the session's number (with pr)
	// writing is 1 + the block of the client's outstanding write, or 0.
	writing *atomic.Int64
}

// login logs in with the client's one ISID: a session given up is
// reinstated (RFC 7143 §6.3.5), so the target ends it — its tasks
// aborted or finished — before the new login completes. The checker
// bounds the operations that failed by that moment (segments.go), and
// checks the target keeps to it.
func (c *client) login(ctx context.Context) error {
	call := c.now()
	s, err := initiator.Login(ctx, c.targets[c.home], iqn, initiator.Options{
		ISID:            [6]byte{0x80, 0x42, 0, 0, byte(c.id >> 8), byte(c.id)},
		InitiatorName:   fmt.Sprintf("iqn.2026-11.org.blockwire:torture-client-%d", c.id),
		Dialer:          &fabric.Dialer{},
		ISER:            c.cfg.Fabric == "iser",
		Connections:     c.cfg.Connections,
		DialTimeout:     2 * time.Second,
		RecoveryTimeout: 15 * time.Second,
		NopInterval:     time.Second,
		Paths:           c.paths(),
	})
	if err != nil {
		return err
	}
	c.rec.addLogin(c.id, login{call: call, ret: c.now(), target: c.home})
	c.s = s
	if c.pr {
		c.nexus = c.rec.newNexus(c.id)
		c.register()
	}
	return nil
}

// connected reports whether the client has a session or a controller.
func (c *client) connected() bool { return c.s != nil || c.nv != nil }

// connect logs in, or over NVMe/TCP makes a controller.
func (c *client) connect(ctx context.Context) error {
	if c.cfg.Fabric != "nvme" {
		return c.login(ctx)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	nv, err := tcphost.Connect(cctx, c.targets[c.home], config.NQNPrefix+iqn, tcphost.Options{
		HostNQN: fmt.Sprintf("nqn.2026-11.org.blockwire:torture-client-%d", c.id), KATO: nvmeKATO})
	if err != nil {
		return err
	}
	c.nv = nv
	if c.pr {
		// An NVMe host registers once for all its controllers: its
		// nexus in the model is the host's, the same for every
		// controller (a write of an earlier controller may land once the
		// host registered again, as the target lets it).
		if c.nexus == 0 {
			c.nexus = c.rec.newNexus(c.id)
		}
		c.register()
	}
	return nil
}

// reached is output.via for an operation sent now.
func (c *client) reached() uint64 {
	if c.nv != nil {
		return 1 << c.home
	}
	return c.via(c.s)
}

// quiesce is output.quiesce for an operation that failed.
func (c *client) quiesce() int64 {
	if c.cfg.Fabric == "nvme" {
		return int64(nvmeQuiesce)
	}
	return 0
}

// block runs one operation on a block: a write of buf (fua), a read
// into buf, or a flush of everything (opSync). A session or controller
// that failed is dropped (the next operation connects again).
func (c *client) block(ctx context.Context, kind opKind, block int, buf []byte, fua bool) error {
	if c.nv == nil {
		var err error
		switch kind {
		case opWrite:
			_, err = c.do(ctx, rw16(0x8a, block, fua), buf, nil)
		case opRead:
			_, err = c.do(ctx, rw16(0x88, block, false), nil, buf)
		default:
			_, err = c.do(ctx, []byte{0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0}, nil, nil)
		}
		return err
	}
	var err error
	switch kind {
	case opWrite:
		err = c.nv.Write(ctx, 1, blockSize, uint64(block), buf, fua)
	case opRead:
		err = c.nv.Read(ctx, 1, blockSize, uint64(block), buf)
	default:
		err = c.nv.Flush(ctx, 1)
	}
	if err != nil && !answered(err) {
		c.cfg.Log.Debug("operation failed", "client", c.id, "err", err)
		c.nv.Close()
		c.nv = nil
	}
	return err
}

// conflict reports whether err is a reservation conflict: the command
// was refused before it ran.
func conflict(err error) bool {
	var se *initiator.SCSIError
	var ne *tcphost.StatusError
	return errors.As(err, &se) && se.Status == statusReservationConflict ||
		errors.As(err, &ne) && ne.Status.SCT() == 0 && ne.Status.SC() == 0x83
}

// answered reports whether err is a command's status: it ended, with
// the target's answer.
func answered(err error) bool {
	var se *initiator.SCSIError
	var ne *tcphost.StatusError
	return errors.As(err, &se) || errors.As(err, &ne)
}

// paths are the failover portals: every target but home.
func (c *client) paths() []string {
	var out []string
	for k, t := range c.targets {
		if k != c.home {
			out = append(out, t)
		}
	}
	return out
}

// via is the targets s has logged in to, as output.via.
func (c *client) via(s *initiator.Session) uint64 {
	var m uint64
	if s == nil {
		return 0
	}
	for _, p := range s.Portals() {
		if k := slices.Index(c.targets, p); k >= 0 {
			m |= 1 << k
		}
	}
	return m
}

// register registers the client's key on its session (REGISTER AND
// IGNORE EXISTING KEY).
//
// One answered with a unit attention (the new session's first command
// gets the reset or power-on condition) did not run (SAM-5 §5.14): it is
// sent again, a few times, instead of being recorded as one that may
// have happened — which left the client unregistered while the checker
// allowed every outcome.
func (c *client) register() {
	op := porcupine.Operation{ClientId: c.id, Input: input{kind: opRegister, nexus: c.nexus}}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.OpTimeout)
	defer cancel()
	var err error
	via := c.reached()
	for range 4 {
		op.Call = c.now()
		if c.nv != nil {
			// Reservation Register, replace with IEKEY: registers the
			// host, or gives it the key again (REGISTER AND IGNORE
			// EXISTING KEY).
			nv := c.nv
			if err = nv.ResvRegister(ctx, 1, tcphost.ResvReplace, 0, clientKey(c.id), true, 0); err != nil && !answered(err) {
				nv.Close()
				c.nv = nil
			}
			break
		}
		_, err = c.do(ctx, prOut(6), prParams(0, clientKey(c.id)), nil)
		var se *initiator.SCSIError
		if !errors.As(err, &se) || se.Status != scsi.StatusCheckCondition || se.Sense == nil || se.Sense.Key != scsi.SenseUnitAttention {
			break
		}
		c.rec.count("register: unit attention, sent again")
	}
	op.Return = c.now()
	if err != nil {
		op.Return, op.Output = math.MaxInt64, output{unknown: true, failed: op.Return, via: via, quiesce: c.quiesce()}
		c.rec.count("register failed")
	} else {
		c.rec.count("register ok")
	}
	c.rec.add(op)
}

func (c *client) run(ctx context.Context) {
	defer func() {
		if c.s != nil {
			c.s.Close()
		}
		if c.nv != nil {
			c.nv.Close()
		}
	}()
	buf := make([]byte, blockSize)
	for ctx.Err() == nil {
		if !c.connected() {
			if err := c.connect(ctx); err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
		}
		block := c.rng.IntN(c.cfg.Blocks)
		op := porcupine.Operation{ClientId: c.id}
		octx, cancel := context.WithTimeout(context.Background(), c.cfg.OpTimeout)
		switch p := c.rng.IntN(100); {
		case p < 45:
			c.seq++
			v := uint64(c.id+1)<<48 | c.seq
			fua := c.rng.IntN(3) == 0
			fill(buf, v)
			// Write-through: every write is durable once acknowledged.
			op.Input = input{kind: opWrite, block: block, value: v, fua: fua, durable: fua || c.cfg.WriteThrough, nexus: c.nexus}
			op.Call = c.now()
			c.writing.Store(int64(block) + 1)
			via := c.reached()
			err := c.block(octx, opWrite, block, buf, fua)
			c.writing.Store(0)
			op.Return = c.now()
			switch {
			case conflict(err):
				// Refused before it ran: it did not happen. Register
				// again (a preemption, or a new session).
				c.rec.count("write refused: reservation conflict")
				if c.connected() {
					c.register()
				}
			case answered(err):
				// It ended with a status (after a replay on a reinstated
				// session, the first copy ended with the old session): it
				// may have happened, but before its answer.
				op.Output = output{unknown: true}
				c.rec.count("write failed")
				c.rec.count("write failed with a status")
				c.rec.add(op)
			case err != nil:
				// It may have happened, or not.
				op.Return, op.Output = math.MaxInt64, output{unknown: true, failed: op.Return, via: via, quiesce: c.quiesce()}
				c.rec.count("write failed")
				c.rec.add(op)
			default:
				c.rec.count("write ok")
				c.rec.add(op)
			}
		case p < 95:
			op.Input = input{kind: opRead, block: block}
			op.Call = c.now()
			err := c.block(octx, opRead, block, buf, false)
			op.Return = c.now()
			if err != nil {
				c.rec.count("read failed")
				break
			}
			c.rec.count("read ok")
			vs := values(buf)
			if len(vs) > 1 {
				// A read overlapping a write of the block may see part
				// of each (model.go): every part must be a value the
				// block held while the read ran.
				c.rec.count("read torn")
				c.cfg.Log.Info("torn read", "block", block, "at", time.Duration(op.Call), "words", tornWords(buf))
			}
			for _, v := range vs {
				op.Output = v
				c.rec.add(op)
			}
		default:
			op.Input = input{kind: opSync}
			op.Call = c.now()
			err := c.block(octx, opSync, 0, nil, false)
			op.Return = c.now()
			if err != nil {
				c.rec.count("sync failed")
				break
			}
			c.rec.count("sync ok")
			c.rec.add(op)
		}
		cancel()
		time.Sleep(c.cfg.Pause)
	}
}

// do runs one command; a session that ended is dropped (the next
// operation logs in again).
func (c *client) do(ctx context.Context, cdb, out, in []byte) (initiator.Result, error) {
	r, err := c.s.Do(ctx, 0, cdb, out, in)
	if err == nil {
		return r, nil
	}
	c.cfg.Log.Debug("operation failed", "client", c.id, "err", err)
	var se *initiator.SCSIError
	if !errors.As(err, &se) {
		// The session failed (recovery gave up) or the command was
		// aborted: start again with a new one.
		c.s.Close()
		c.s = nil
	}
	return r, err
}

// rw16 is READ(16) (0x88) or WRITE(16) (0x8a) of one block.
func rw16(op byte, block int, fua bool) []byte {
	cdb := make([]byte, 16)
	cdb[0] = op
	if fua {
		cdb[1] = 0x08
	}
	binary.BigEndian.PutUint64(cdb[2:], uint64(block))
	binary.BigEndian.PutUint32(cdb[10:], 1)
	return cdb
}

// fill writes v into every 8-byte word of b.
func fill(b []byte, v uint64) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], v)
	}
}

// values reads back what fill wrote: one value, or for a torn block
// each value found in it, as read outputs. The tear itself may fall
// inside a word (a copy by bytes, as Linux's page cache and an emulated
// CPU do):
//
//   - a word whose every byte is that of the word before or of the word
//     after, those two differing, is where one value gives way to the
//     other and is no value of its own: it is passed over;
//   - the first or the last word, which has one neighbour, may hold the
//     bytes of a value seen nowhere else in the block (the tear fell in
//     its first or last eight bytes). When it differs from its neighbour
//     and spells no value found whole in the block, it counts as a part
//     of a value: the bytes that differ from the neighbour's (mask),
//     which must be those of a value the block held while the read ran.
//
// Any other word counts as the value it spells, and one that was never
// written breaks the model.
func values(b []byte) []output {
	n := len(b) / 8
	word := func(i int) uint64 { return binary.LittleEndian.Uint64(b[i*8:]) }
	var whole []uint64
	for i := 0; i < n; i++ {
		v := word(i)
		if i > 0 && i+1 < n && tornBetween(v, word(i-1), word(i+1)) {
			continue
		}
		if !slices.Contains(whole, v) {
			whole = append(whole, v)
		}
	}
	var out []output
	for _, v := range whole {
		o := output{value: v}
		if n > 1 && !wholeElsewhere(b, v) {
			switch {
			case v == word(0) && v != word(1):
				o.mask = bytesDiffering(v, word(1))
			case v == word(n-1) && v != word(n-2):
				o.mask = bytesDiffering(v, word(n-2))
			}
		}
		out = append(out, o)
	}
	return out
}

// wholeElsewhere reports whether v is a word of b other than its first
// and last.
func wholeElsewhere(b []byte, v uint64) bool {
	for i := 8; i+16 <= len(b); i += 8 {
		if binary.LittleEndian.Uint64(b[i:]) == v {
			return true
		}
	}
	return false
}

// bytesDiffering is the mask of the bytes in which v and w differ.
func bytesDiffering(v, w uint64) uint64 {
	var m uint64
	for k := 0; k < 64; k += 8 {
		if (v^w)>>k&0xff != 0 {
			m |= 0xff << k
		}
	}
	return m
}

// tornBetween reports whether v, differing from both a and b (which
// differ), has each byte of a or of b.
func tornBetween(v, a, b uint64) bool {
	if a == b || v == a || v == b {
		return false
	}
	for k := 0; k < 64; k += 8 {
		if x := v >> k & 0xff; x != a>>k&0xff && x != b>>k&0xff {
			return false
		}
	}
	return true
}

// tornWords describes a torn block: each run of equal words as
// "value@first-byte".
func tornWords(b []byte) string {
	var out []string
	prev := uint64(0)
	for i := 0; i+8 <= len(b); i += 8 {
		v := binary.LittleEndian.Uint64(b[i:])
		if i == 0 || v != prev {
			out = append(out, fmt.Sprintf("%x@%d", v, i))
		}
		prev = v
	}
	return strings.Join(out, " ")
}

// Persistent reservations (SPC-4 §6.16, PERSISTENT RESERVE OUT).
const (
	statusReservationConflict = 0x18
	adminKey                  = 0xAD
	prTypeWERO                = 5 // Write Exclusive – Registrants Only
)

func clientKey(c int) uint64 { return 0x1000 + uint64(c) + 1 }

// prOut is a PERSISTENT RESERVE OUT CDB: service action sa (1 RESERVE, 5
// PREEMPT AND ABORT, 6 REGISTER AND IGNORE EXISTING KEY), type WERO, 24
// bytes of parameters.
func prOut(sa byte) []byte {
	cdb := make([]byte, 10)
	cdb[0], cdb[1], cdb[2] = 0x5f, sa, prTypeWERO
	binary.BigEndian.PutUint32(cdb[5:], 24)
	return cdb
}

// prParams is its parameter list: the reservation key and the service
// action reservation key.
func prParams(key, saKey uint64) []byte {
	p := make([]byte, 24)
	binary.BigEndian.PutUint64(p[0:], key)
	binary.BigEndian.PutUint64(p[8:], saKey)
	return p
}

// reserve logs in to the target at addr as the preemptor, registers its
// key and takes the reservation.
func reserve(ctx context.Context, addr string) (*initiator.Session, error) {
	s, err := initiator.Login(ctx, addr, iqn, initiator.Options{
		InitiatorName: "iqn.2026-11.org.blockwire:torture-preemptor", Dialer: &fabric.Dialer{}, NopInterval: time.Second})
	if err != nil {
		return nil, err
	}
	for _, step := range []struct {
		sa         byte
		key, saKey uint64
	}{{6, 0, adminKey}, {1, adminKey, 0}} {
		// The first command may meet the LU's power-on unit attention.
		for try := 0; ; try++ {
			_, err = s.Do(ctx, 0, prOut(step.sa), prParams(step.key, step.saKey), nil)
			if err == nil || try == 2 {
				break
			}
		}
		if err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}
