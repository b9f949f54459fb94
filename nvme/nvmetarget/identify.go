package nvmetarget

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"strconv"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/nvme"
)

// identify executes Identify: the controller, a namespace, the active
// namespace list and a namespace's identification descriptors (Base
// 2.0, "Identify Command").
func (c *Controller) identify(cmd *nvme.Command, data []byte) Result {
	const size = 4096
	if len(data) < size {
		return fail(nvme.StatusInvalidField)
	}
	b := data[:size]
	clear(b)
	switch cns := uint8(cmd.CDW[0]); cns {
	case identifyCtrl:
		c.identifyController(b)
	case identifyNS:
		u := c.s.namespace(c.hostNQN, cmd.NSID)
		if u == nil {
			if cmd.NSID == 0 || cmd.NSID == 0xffffffff {
				return fail(nvme.StatusInvalidNamespace)
			}
			return Result{N: size} // an inactive NSID: zeroes
		}
		identifyNamespace(b, u)
		if _, ana := c.s.ana(); ana {
			put32(b[92:], anaGroup) // ANAGRPID
		}
	case identifyActiveNS:
		if cmd.NSID >= 0xfffffffe {
			return fail(nvme.StatusInvalidNamespace)
		}
		i := 0
		for _, id := range c.s.Namespaces() {
			if id > cmd.NSID && c.s.visible(c.hostNQN, id) && i < 1024 {
				put32(b[4*i:], id)
				i++
			}
		}
	case identifyNSDesc:
		u := c.s.namespace(c.hostNQN, cmd.NSID)
		if u == nil {
			return fail(nvme.StatusInvalidNamespace)
		}
		id := u.ID()
		// NGUID (type 2), then a UUID (type 3) of the same bits with the
		// RFC 4122 version 4 and variant marks.
		b[0], b[1] = 2, 16
		copy(b[4:20], id[:])
		uuid := id
		uuid[6] = uuid[6]&0x0f | 0x40
		uuid[8] = uuid[8]&0x3f | 0x80
		b[20], b[21] = 3, 16
		copy(b[24:40], uuid[:])
	default:
		return fail(nvme.StatusInvalidField)
	}
	return Result{N: size}
}

// identifyController fills the Identify Controller data structure.
func (c *Controller) identifyController(b []byte) {
	t := c.s.t
	put16(b[0:], 0) // VID: none assigned
	put16(b[2:], 0) // SSVID
	padded(b[4:24], c.s.serial())
	padded(b[24:64], c.s.model())
	padded(b[64:72], t.o.Firmware)
	b[72] = 6        // RAB
	b[76] = 1<<1 | 1 // CMIC: more than one controller, more than one port
	if c.s.discovery {
		b[76] = 0
	}
	b[77] = t.o.MDTS
	put16(b[78:], c.id)
	put32(b[80:], nvme.Version(1, 3))
	put32(b[92:], aenNamespace) // OAES
	if _, ana := c.s.ana(); ana {
		b[76] |= 1 << 3 // CMIC: ANA reporting
		put32(b[92:], aenNamespace|aenANA)
		b[343] = 10                                      // ANATT: 10 s at most in transition
		b[344] = 1<<0 | 1<<1 | 1<<2 | 1<<3 | 1<<4 | 1<<6 // ANACAP: every state; ANAGRPID fixed while attached
		put32(b[345:], anaGroup)                         // ANAGRPMAX
		put32(b[349:], anaGroup)                         // NANAGRPID
		put32(b[540:], maxNamespaces)                    // MNAN
	}
	put32(b[96:], 1) // CTRATT: 128-bit host identifier
	b[111] = 1       // CNTRLTYPE: I/O controller
	if c.s.discovery {
		b[111] = 2
	}
	b[258] = abortLimit - 1 // ACL
	b[259] = aerLimit - 1   // AERL
	b[260] = 1<<1 | 1       // FRMW: one slot, read-only
	b[261] = 1<<2 | 1<<1    // LPA: extended data, commands and effects log
	b[262] = 0              // ELPE: one error log entry
	put16(b[320:], 10)      // KAS: keep alive in units of 100 ms... of 1 s
	b[512] = 6<<4 | 6       // SQES
	b[513] = 4<<4 | 4       // CQES
	put16(b[514:], uint16(t.o.QueueSize))
	if !c.s.discovery {
		put32(b[516:], 0xfffffffe) // NN
		if _, ana := c.s.ana(); ana {
			put32(b[516:], maxNamespaces) // what the ANA log page can list
		}
		// ONCS: Compare, Dataset Management, Write Zeroes, Reservations.
		put16(b[520:], 1<<0|1<<2|1<<3|1<<5)
		put16(b[522:], 1) // FUSES: Compare and Write
		// ACWU (atomic compare and write unit, blocks, 0's based): left 0,
		// one block at least; the limit a command may use is fusedLimit.
		b[525] = 1 | 3<<1 // VWC: present, flush of every namespace (NSID FFFFFFFFh)
	}
	// SGLS: SGLs without alignment; the address of a data block may be
	// an offset (in-capsule data).
	put32(b[536:], 1|1<<20)
	copy(b[768:1024], c.s.nqn)
	// The fabrics fields: the capsule sizes in 16-byte units, the
	// dynamic controller model, one SGL descriptor.
	put32(b[1792:], uint32(nvme.SQELen+t.o.InCapsuleData)/16)
	put32(b[1796:], 1)
	b[1803] = 1
}

// serial is the subsystem's serial number: configured, else from its NQN.
func (s *Subsystem) serial() string {
	if s.cfg.Serial != "" {
		return s.cfg.Serial
	}
	h := fnv.New64a()
	h.Write([]byte(s.nqn))
	return fmt.Sprintf("%016x", h.Sum64())
}

func (s *Subsystem) model() string {
	if s.discovery {
		return "blockwire discovery"
	}
	if s.cfg.Model != "" {
		return s.cfg.Model
	}
	return "blockwire"
}

// identifyNamespace fills the Identify Namespace data structure of u.
func identifyNamespace(b []byte, u *blockcore.Unit) {
	n := u.Blocks()
	put64(b[0:], n)  // NSZE
	put64(b[8:], n)  // NCAP
	put64(b[16:], n) // NUSE
	if u.CanUnmap() {
		b[24] = 1        // NSFEAT: thin provisioning
		b[33] = 1<<3 | 1 // DLFEAT: deallocated blocks read zeroes; Write Zeroes may deallocate
	}
	b[25] = 0         // NLBAF: one format
	b[26] = 0         // FLBAS: format 0
	b[30] = 1         // NMIC: may be attached to several controllers
	b[31] = rescap(u) // RESCAP
	id := u.ID()
	copy(b[104:120], id[:]) // NGUID
	put32(b[128:], uint32(u.BlockBits())<<16)
	if u.ReadOnly() {
		b[99] = 1 // NSATTR: write protected
	}
}

// getLogPage executes Get Log Page.
func (c *Controller) getLogPage(cmd *nvme.Command, data []byte) Result {
	lid := uint8(cmd.CDW[0])
	rae := cmd.CDW[0]&(1<<15) != 0
	numd := uint64(cmd.CDW[0]>>16|cmd.CDW[1]<<16) + 1
	off := uint64(cmd.CDW[2]) | uint64(cmd.CDW[3])<<32
	length := numd * 4
	if length > uint64(len(data)) {
		return fail(nvme.StatusInvalidField)
	}
	var page []byte
	switch {
	case lid == logDiscovery && c.s.discovery:
		page = c.s.t.discoveryLog()
	case c.s.discovery:
		return fail(nvme.StatusInvalidLogPage)
	case lid == logError:
		page = make([]byte, 64)
	case lid == logSMART:
		page = make([]byte, 512)
		put16(page[1:], 273+30) // composite temperature, kelvin
		page[3], page[4] = 100, 10
	case lid == logFirmware:
		page = make([]byte, 512)
		page[0] = 1
		padded(page[8:16], c.s.t.o.Firmware)
	case lid == logChangedNS:
		page = make([]byte, 4096)
		c.mu.Lock()
		for i, id := range c.changed {
			put32(page[4*i:], id)
		}
		if !rae {
			c.changed = nil
		}
		c.mu.Unlock()
	case lid == logANA:
		if _, ana := c.s.ana(); !ana {
			return fail(nvme.StatusInvalidLogPage)
		}
		page = c.anaLog(cmd.CDW[0]>>8&1 != 0) // LSP bit 0: return groups only
	case lid == logResvNotice:
		page = c.resvLogPage(rae)
	case lid == logEffects:
		page = make([]byte, 4096)
		for _, op := range []uint8{nvme.AdminGetLogPage, nvme.AdminIdentify, nvme.AdminAbort, nvme.AdminSetFeatures,
			nvme.AdminGetFeatures, nvme.AdminAsyncEventReq, nvme.AdminKeepAlive} {
			put32(page[4*int(op):], 1)
		}
		for _, op := range []uint8{nvme.OpFlush, nvme.OpRead, nvme.OpCompare, nvme.OpResvRegister, nvme.OpResvReport,
			nvme.OpResvAcquire, nvme.OpResvRelease} {
			put32(page[1024+4*int(op):], 1)
		}
		for _, op := range []uint8{nvme.OpWrite, nvme.OpWriteZeroes, nvme.OpDatasetMgmt} {
			put32(page[1024+4*int(op):], 1|1<<1) // CSUPP, LBCC
		}
	default:
		return fail(nvme.StatusInvalidLogPage)
	}
	if !rae {
		c.mu.Lock()
		// Reading the log page an event named unmasks that event.
		kept := c.events[:0]
		for _, e := range c.events {
			if uint8(e>>16) != lid {
				kept = append(kept, e)
			}
		}
		c.events = kept
		c.mu.Unlock()
	}
	out := data[:length]
	clear(out)
	if off < uint64(len(page)) {
		copy(out, page[off:])
	} else if off > 0 && lid != logDiscovery {
		return fail(nvme.StatusInvalidField)
	}
	return Result{N: int(length)}
}

// discoveryLog is the discovery log page: a header, then an entry for
// each subsystem on each portal that serves it (NVMe over Fabrics 1.1,
// "Discovery Log Page").
func (t *Target) discoveryLog() []byte {
	var ports []Portal
	if t.o.Portals != nil {
		ports = t.o.Portals()
	}
	subs := t.Subsystems()
	var entries [][]byte
	for _, p := range ports {
		for _, nqn := range append(subs, DiscoveryNQN) {
			if nqn != DiscoveryNQN && p.Serves != nil && !p.Serves(nqn) {
				continue
			}
			e := make([]byte, 1024)
			e[0] = 3 // TRTYPE: TCP
			e[1] = 1 // ADRFAM: IPv4
			if p.Addr.Addr().Is6() && !p.Addr.Addr().Is4In6() {
				e[1] = 2
			}
			e[2] = 2 // SUBTYPE: NVM subsystem
			if nqn == DiscoveryNQN {
				e[2] = 3 // the current discovery subsystem
			}
			e[3] = 2 // TREQ: secure channel not required
			put16(e[4:], p.ID)
			put16(e[6:], 0xffff) // CNTLID: dynamic
			put16(e[8:], AdminQueueSize)
			padded(e[32:64], strconv.Itoa(int(p.Addr.Port())))
			copy(e[256:512], nqn)
			padded(e[512:768], addrString(p.Addr.Addr()))
			entries = append(entries, e)
		}
	}
	page := make([]byte, 1024, 1024*(1+len(entries)))
	put64(page[0:], t.genctr.Load())
	put64(page[8:], uint64(len(entries)))
	for _, e := range entries {
		page = append(page, e...)
	}
	return page
}

func addrString(a netip.Addr) string { return a.Unmap().String() }
