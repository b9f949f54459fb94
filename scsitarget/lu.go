package scsitarget

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/scsi"
)

// LUConfig describes a logical unit.
type LUConfig struct {
	LUN       uint64
	Backend   backend.Backend
	BlockSize int // 512 or 4096; default 512
	ReadOnly  bool
	// Serial is the unit serial number (VPD 80h); derived from the target
	// name and LUN when empty.
	Serial    string
	VendorID  string // up to 8 ASCII characters
	ProductID string // up to 16 ASCII characters
	// Removable makes the medium removable (RMB): START STOP UNIT with
	// LOEJ ejects and loads it, PREVENT ALLOW MEDIUM REMOVAL holds it in.
	Removable bool
	// WriteThrough starts the LU with its write cache disabled (WCE 0):
	// every write is made durable (the backend's Flush) before it is
	// acknowledged. MODE SELECT may change it; a LU reset restores it.
	WriteThrough bool
	// PRFile, when set, is where persistent reservations are kept when an
	// initiator asks for them to survive power loss (APTPL, SPC-4
	// §5.13.4); they are loaded from it here. Empty: APTPL is refused.
	PRFile string
	// Logger receives the LU's own events (shared reservation state,
	// failed writes and flushes, blockcore.Store);
	// may be nil.
	Logger *slog.Logger
	// Workers run the LU's commands (Submit; default blockcore.DefaultWorkers);
	// QueueDepth
	// bounds the commands waiting for one (blockcore.DefaultQueueDepth): beyond it
	// the fabrics answer TASK SET FULL.
	Workers, QueueDepth int
}

// LU is one logical unit: a block device on a backend.
type LU struct {
	dev  *Device
	lun  uint64
	be   backend.Backend
	unit *blockcore.Unit // what the NVMe front end shares
	// otherWrites is held shared by every write another front end (NVMe)
	// runs, from before its reservation check until it ended; a PREEMPT
	// AND ABORT takes it exclusively once the state changed, so the
	// preempted hosts' writes admitted before it have ended when it
	// completes (prunit.go). Lock order: before lu.pr.mu; taken
	// exclusively with no other lock held.
	otherWrites sync.RWMutex
	store       *blockcore.Store // the unit's: writes, durability, the flush latch
	fast        bool             // the backend is backend.NonBlocking
	q           *blockcore.Queue
	unmapper    backend.Unmapper
	blockSize   int
	blockBits   uint
	readOnly    bool
	removable   bool
	serial      string
	vendor      string
	product     string
	naa         [16]byte
	// epoch is the LU's creation; since reads the monotonic clock against
	// it, one clock read where time.Now makes two (wall and monotonic):
	// Begin and End time every command.
	epoch time.Time

	stateMu  sync.Mutex
	dsense   bool            // descriptor-format sense (control mode page)
	stopped  bool            // START STOP UNIT with START=0
	swp      bool            // software write protect (control mode page)
	ejected  bool            // removable medium not present
	prevent  map[*Nexus]bool // nexuses preventing medium removal
	defaults struct{ dsense bool }
	// reserver holds the SPC-2 reservation (RESERVE(6/10)), nil when
	// there is none.
	reserver *Nexus
	pr       prState // persistent reservations

	taskMu sync.Mutex
	tasks  *Command
	// inTasks counts tasks (written under taskMu, read without it).
	inTasks atomic.Int32

	// sanitizing is set while a SANITIZE runs: media access is NOT READY.
	sanitizing atomic.Bool
}

// NewLU builds a logical unit for device name on cfg.Backend.
func NewLU(targetName string, cfg LUConfig) (*LU, error) {
	if cfg.Backend == nil {
		return nil, errors.New("target: LU needs a backend")
	}
	lu := &LU{
		lun:       cfg.LUN,
		be:        cfg.Backend,
		readOnly:  cfg.ReadOnly,
		removable: cfg.Removable,
		serial:    cfg.Serial,
		vendor:    cfg.VendorID,
		product:   cfg.ProductID,
		epoch:     time.Now(),
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Shared storage names itself: every target serving it reports the
	// same LU (one disk on several paths).
	unit, err := blockcore.NewUnit(blockcore.UnitConfig{Backend: cfg.Backend, BlockSize: cfg.BlockSize,
		ReadOnly: cfg.ReadOnly, WriteThrough: cfg.WriteThrough, Identity: fmt.Sprintf("%s\x00%d", targetName, cfg.LUN),
		Workers: cfg.Workers, QueueDepth: cfg.QueueDepth, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("target: LUN %d: %w", cfg.LUN, err)
	}
	lu.unit, lu.store, lu.q = unit, unit.Store(), unit.Queue()
	unit.SetReservations(luReservations{lu})
	lu.blockSize, lu.blockBits, lu.fast = unit.BlockSize(), unit.BlockBits(), unit.NonBlocking()
	lu.unmapper, _ = cfg.Backend.(backend.Unmapper)
	if lu.vendor == "" {
		lu.vendor = "BLOCKWIR"
	}
	if lu.product == "" {
		lu.product = "blockwire"
	}
	ident := unit.Identity()
	h := fnv.New64a()
	h.Write([]byte(ident))
	sum := h.Sum64()
	if lu.serial == "" {
		lu.serial = fmt.Sprintf("%016x", sum)
	}
	// NAA 6 (IEEE Registered Extended) designator. The OUI is the locally
	// administered placeholder 0x000000 with the vendor-specific bits taken
	// from a hash of the target name and LUN, so it is stable across
	// restarts and unique per LU in practice.
	lu.naa = unit.ID()
	lu.naa[0] = 0x60 | lu.naa[0]&0x0f
	lu.naa[1], lu.naa[2] = 0, 0
	lu.naa[3] &= 0x0f
	unit.WatchCapacity(lu.capacityChanged)
	lu.pr.file = cfg.PRFile
	if err := lu.pr.load(); err != nil {
		return nil, fmt.Errorf("target: LUN %d persistent reservations: %w", cfg.LUN, err)
	}
	if sh, ok := cfg.Backend.(backend.SharedState); ok {
		// Shared storage: the reservations live with it, for every
		// target in front of it.
		lu.pr.onReset = func() {
			// A reset through another target: this one's nexuses get
			// the unit attention too.
			if d := lu.device(); d != nil {
				d.forEachNexus(func(n *Nexus) { n.addUA(lu.lun, scsi.UALUReset()) })
			}
		}
		lu.pr.onALUA = func(states map[uint16]scsi.ALUAState) {
			// SET TARGET PORT GROUPS through another gateway.
			if d := lu.device(); d != nil {
				d.setExplicit(states, nil)
			}
		}
		if err := lu.pr.attachShared(sh, cfg.Logger); err != nil {
			return nil, fmt.Errorf("target: LUN %d shared persistent reservations: %w", cfg.LUN, err)
		}
	}
	return lu, nil
}

// LUN returns the logical unit number.
func (lu *LU) LUN() uint64 { return lu.lun }

// Blocks returns the capacity in logical blocks.
func (lu *LU) Blocks() uint64 { return lu.unit.Blocks() }

// Unit is the LU's block unit, which other front ends (NVMe) share.
func (lu *LU) Unit() *blockcore.Unit { return lu.unit }

// BlockSize returns the logical block size in bytes.
func (lu *LU) BlockSize() int { return lu.blockSize }

// ReadOnly reports whether the LU is write-protected.
func (lu *LU) ReadOnly() bool { return lu.readOnly }

// NonBlocking reports whether the LU's I/O never waits (a memory
// backend), so a fabric may run its commands on the receiving goroutine.
func (lu *LU) NonBlocking() bool { return lu.fast }

// writeProtected reports the write protection in force now: the LU's own,
// or software write protect set through the control mode page (SWP).
func (lu *LU) writeProtected() (bool, *scsi.Sense) {
	if lu.readOnly {
		return true, scsi.WriteProtected()
	}
	lu.stateMu.Lock()
	swp := lu.swp
	lu.stateMu.Unlock()
	if swp {
		return true, &scsi.Sense{Key: scsi.SenseDataProtect, ASC: 0x27, ASCQ: 0x02, Bit: -1} // LOGICAL UNIT SOFTWARE WRITE PROTECTED
	}
	return false, nil
}

// Flush flushes the backend's volatile cache. A failure latches: every
// later Flush and write fails too (blockcore.Store.Flush).
func (lu *LU) Flush() error { return lu.store.Flush() }

// Close flushes and closes the backend.
func (lu *LU) Close() error { return lu.unit.Close() }

// Resize changes the capacity (the backend must support it) and raises
// CAPACITY DATA HAS CHANGED on every nexus (capacityChanged, through the
// unit).
func (lu *LU) Resize(size int64) error {
	if err := lu.unit.Resize(size); err != nil {
		return fmt.Errorf("target: LUN %d: %w", lu.lun, err)
	}
	return nil
}

// capacityChanged raises CAPACITY DATA HAS CHANGED on every nexus after
// the unit's capacity changed (here, another front end, or the backend).
func (lu *LU) capacityChanged() {
	if d := lu.device(); d != nil {
		d.forEachNexus(func(x *Nexus) { x.addUA(lu.lun, scsi.UACapacityChanged()) })
	}
}

// device is the LU's device, for code that may run before AddLU.
func (lu *LU) device() *Device {
	lu.stateMu.Lock()
	defer lu.stateMu.Unlock()
	return lu.dev
}

func (lu *LU) reset() {
	lu.stateMu.Lock()
	lu.store.ResetWriteCache()
	lu.dsense = lu.defaults.dsense
	lu.stopped = false
	lu.swp = false
	lu.prevent = nil  // SPC-4 §6.13: a reset allows medium removal again
	lu.reserver = nil // SPC-2 §5.5.1: a LU reset releases the reservation
	lu.stateMu.Unlock()
}

func (lu *LU) writeCache() bool { return lu.store.WriteCache() }

func (lu *LU) descriptorSense() bool {
	lu.stateMu.Lock()
	defer lu.stateMu.Unlock()
	return lu.dsense
}

// notReady is the NOT READY condition for media access, if any: medium
// not present (ejected), or stopped.
func (lu *LU) notReady() *scsi.Sense {
	lu.stateMu.Lock()
	defer lu.stateMu.Unlock()
	switch {
	case lu.ejected:
		return &scsi.Sense{Key: scsi.SenseNotReady, ASC: 0x3a, Bit: -1} // MEDIUM NOT PRESENT
	case lu.stopped:
		return scsi.NotReadyStopped()
	}
	return nil
}

// since is the time since the LU was made, on the monotonic clock.
func (lu *LU) since() time.Duration { return time.Since(lu.epoch) }
