package nvmetarget

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"strings"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/nvme"
)

// Reservations (NVMe Base 2.0, "Reservations"; the commands Reservation
// Register, Report, Acquire and Release of the NVM command set). The
// state is the unit's (blockcore.Reservations) — one state with the SCSI
// LU on the same image. A registrant is a host, named by its 128-bit
// host identifier: every controller of the host, on every path, acts as
// the same registrant.

// Statuses of reservations.
var (
	statusReservationConflict = nvme.MakeStatus(nvme.SCTGeneric, 0x83, true)
	statusHostIDFormat        = nvme.MakeStatus(nvme.SCTGeneric, 0x18, true) // Host Identifier Inconsistent Format
)

// hostPrefix starts an NVMe host's name in the reservation state.
const hostPrefix = "nvme-host:"

// registrantName is the reservation state's name of the host with
// identifier id.
func registrantName(id [16]byte) string { return hostPrefix + hex.EncodeToString(id[:]) }

// resvStatus is the status of a reservation verb's error.
func resvStatus(err error) nvme.Status {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, blockcore.ErrReservationConflict):
		return statusReservationConflict
	case errors.Is(err, blockcore.ErrReservationInvalid):
		return nvme.StatusInvalidField
	case errors.Is(err, backend.ErrUnavailable):
		return nvme.StatusNamespaceNotReady
	}
	return nvme.StatusInternalError
}

// admit checks a command of the host against the unit's reservation (a
// write: it changes the medium, or flushes it); the ticket goes to
// r.Done once the command ended.
func (q *Queue) admit(u *blockcore.Unit, write bool) (r blockcore.Reservations, ticket uint64, ok bool) {
	r = u.Reservations()
	if r == nil {
		return nil, 0, true
	}
	ok, ticket = r.Admit(q.c.resvName, write)
	return r, ticket, ok
}

// resv executes a reservation command on u.
func (q *Queue) resv(c *nvme.Command, data []byte, u *blockcore.Unit) Result {
	r := u.Reservations()
	if r == nil {
		return fail(nvme.StatusInvalidOpcode)
	}
	name := q.c.resvName
	cdw10 := c.CDW[0]
	action, iekey, rtype := cdw10&7, cdw10&(1<<3) != 0, blockcore.ReservationType(cdw10>>8)
	key := func(i int) uint64 { return get64(data[8*i:]) }
	switch c.Opcode {
	case nvme.OpResvRegister:
		if len(data) < 16 {
			return fail(statusSGLLength)
		}
		// CPTPL: 00b no change, 10b off, 11b on.
		persist := 0
		switch cdw10 >> 30 {
		case 1:
			return fail(nvme.StatusInvalidField)
		case 2:
			persist = 1
		case 3:
			persist = 2
		}
		if action > 2 {
			return fail(nvme.StatusInvalidField)
		}
		return fail(resvStatus(r.Register(name, blockcore.RegisterAction(action), key(0), key(1), iekey, persist)))
	case nvme.OpResvAcquire:
		if len(data) < 16 {
			return fail(statusSGLLength)
		}
		// IEKEY has no meaning here since NVMe 1.3 (RESCAP's IEK13).
		if action > 2 {
			return fail(nvme.StatusInvalidField)
		}
		return fail(resvStatus(r.Acquire(name, blockcore.AcquireAction(action), rtype, key(0), key(1))))
	case nvme.OpResvRelease:
		if len(data) < 8 {
			return fail(statusSGLLength)
		}
		if action > 1 {
			return fail(nvme.StatusInvalidField)
		}
		return fail(resvStatus(r.Release(name, action == 1, rtype, key(0))))
	case nvme.OpResvReport:
		return q.resvReport(c, data, r)
	}
	return fail(nvme.StatusInvalidOpcode)
}

// resvReport executes Reservation Report: the extended data structure
// only (a fabrics host identifier has 128 bits): a 64-byte header —
// generation, type, registrant count, persistence — then 64 bytes per
// registrant — controller ID (FFFFh: none, or not an NVMe host), whether
// it holds the reservation, key, host identifier (zero for a SCSI
// registrant).
func (q *Queue) resvReport(c *nvme.Command, data []byte, r blockcore.Reservations) Result {
	if c.CDW[1]&1 == 0 {
		return fail(statusHostIDFormat)
	}
	n := min(len(data), int(c.CDW[0]+1)*4)
	clear(data[:n])
	st := r.Status()
	full := make([]byte, 64+64*len(st.Registrants))
	put32(full[0:], st.Generation)
	full[4] = byte(st.Type)
	put16(full[5:], uint16(len(st.Registrants)))
	if st.Persist {
		full[9] = 1
	}
	ctrls := q.c.s.liveControllers()
	for i, reg := range st.Registrants {
		e := full[64+64*i:]
		put16(e[0:], 0xffff)
		if reg.Holder {
			e[2] = 1
		}
		put64(e[8:], reg.Key)
		if id, ok := strings.CutPrefix(reg.Name, hostPrefix); ok {
			var hid [16]byte
			if b, err := hex.DecodeString(id); err == nil && len(b) == 16 {
				copy(hid[:], b)
				copy(e[16:32], b)
			}
			if k := slices.IndexFunc(ctrls, func(c *Controller) bool { return c.hostID == hid }); k >= 0 {
				put16(e[0:], ctrls[k].id)
			}
		}
	}
	return Result{N: copy(data[:n], full)}
}

func get64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

// liveControllers is the subsystem's controllers, lowest ID first.
func (s *Subsystem) liveControllers() []*Controller {
	s.mu.Lock()
	out := s.controllers()
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b *Controller) int { return int(a.id) - int(b.id) })
	return out
}

// rescap is Identify Namespace's RESCAP for u: every type, IEKEY as NVMe
// 1.3 defines it, persistence where the state can persist.
func rescap(u *blockcore.Unit) byte {
	r := u.Reservations()
	if r == nil {
		return 0
	}
	b := byte(0x7e | 0x80)
	if r.CanPersist() {
		b |= 1
	}
	return b
}

// resvEntry is one reservation notification.
type resvEntry struct {
	nsid uint32
	n    blockcore.ReservationNotice
}

// resvLogLimit bounds the notices a controller keeps for its host to
// read; older ones are dropped (the log's count tells the host some were).
const resvLogLimit = 64

// reservationNotice tells the controllers of the hosts names lists that
// notice n happened on namespace nsid (called with the reservation
// state's lock held: it takes s.mu and each controller's mu, and sends
// the event from a goroutine of its own).
func (s *Subsystem) reservationNotice(nsid uint32, n blockcore.ReservationNotice, names []string) {
	s.mu.Lock()
	ctrls := s.controllers()
	s.mu.Unlock()
	for _, c := range ctrls {
		if slices.Contains(names, c.resvName) && s.visible(c.hostNQN, nsid) {
			c.resvNotice(nsid, n)
		}
	}
}

// resvNotice logs a notice and raises its event: I/O command specific
// status (type 6), Reservation Log Page Available (00h), log 80h — unless
// the host masked it for the namespace (Set Features 82h).
func (c *Controller) resvNotice(nsid uint32, n blockcore.ReservationNotice) {
	c.mu.Lock()
	if c.resvMaskOf(nsid)&(1<<n) != 0 {
		c.mu.Unlock()
		return
	}
	c.resvCount++
	if c.resvCount == 0 {
		c.resvCount = 1
	}
	if len(c.resvLog) == resvLogLimit {
		c.resvLog = c.resvLog[1:]
	}
	c.resvLog = append(c.resvLog, resvEntry{nsid, n})
	post := c.eventLocked(6 | 0x00<<8 | logResvNotice<<16)
	c.mu.Unlock()
	if post != nil {
		go post()
	}
}

// resvMaskOf is the notices masked for nsid (c.mu held).
func (c *Controller) resvMaskOf(nsid uint32) uint32 {
	if m, ok := c.resvMask[nsid]; ok {
		return m
	}
	return c.resvMask[0xffffffff]
}

// resvLogPage is the reservation notification log page: the oldest
// notice not read (all zeroes when none), taken off the log unless rae.
// Its count is the notice's number among all this controller logged; the
// number of available pages, the notices after it (at most 255).
func (c *Controller) resvLogPage(rae bool) []byte {
	page := make([]byte, 64)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.resvLog) == 0 {
		return page
	}
	e := c.resvLog[0]
	put64(page[0:], c.resvCount-uint64(len(c.resvLog))+1)
	page[8] = byte(e.n)
	page[9] = byte(min(len(c.resvLog)-1, 255))
	put32(page[12:], e.nsid)
	if !rae {
		c.resvLog = c.resvLog[1:]
	}
	return page
}
