package scsitarget

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/internal/atomicfile"
	"github.com/blockwire/blockwire/internal/logsample"
	"github.com/blockwire/blockwire/scsi"
)

// Persistent reservations (SPC-4 §5.13, PERSISTENT RESERVE IN/OUT §6.15,
// §6.16). Registrations belong to I_T nexuses by name (initiator port,
// target port), so they survive the nexus's session ending and apply
// again when the same initiator port returns; ALL_TG_PT registers the
// initiator port through every target port. Scope is always the LU.
// APTPL keeps the state in the LU's PRFile (file-backed LUs), written
// atomically on every change and loaded at start.

// PR types.
const (
	prWE   = 1 // Write Exclusive
	prEA   = 3 // Exclusive Access
	prWERO = 5 // Write Exclusive – Registrants Only
	prEARO = 6 // Exclusive Access – Registrants Only
	prWEAR = 7 // Write Exclusive – All Registrants
	prEAAR = 8 // Exclusive Access – All Registrants
)

// prKey names an I_T nexus; a registration with an empty tp was made
// with ALL_TG_PT and covers every target port.
type prKey struct{ ip, tp string }

func keyOf(n *Nexus) prKey { return prKey{n.InitiatorPort, n.TargetPort} }

type prState struct {
	mu         sync.Mutex
	generation uint32
	regs       map[prKey]uint64
	order      []prKey // registration order, for READ KEYS / READ FULL STATUS
	rtype      uint8   // 0: no reservation
	holder     prKey   // for types other than the all-registrants ones
	aptpl      bool    // the last registration asked to persist through power loss
	file       string  // where APTPL state lives; empty: APTPL not offered

	// shared keeps the state in shared storage for every target serving
	// it (several gateways on one RBD image): each change is stored
	// there, conditional on version, and the others are told (stale).
	shared  backend.SharedState
	version uint64 // the shared record's version this copy holds
	resets  uint64 // logical unit resets recorded in the shared record
	onReset func() // called (p.mu held) when another target reset the LU
	// alua: the port group states SET TARGET PORT GROUPS gave, kept in
	// the shared record for every gateway; aluaRec is the same, readable
	// without p.mu; onALUA is called (p.mu held) when another gateway
	// changed them. Lock order: p.mu, then the device's mu.
	alua    map[uint16]scsi.ALUAState
	aluaRec atomic.Pointer[map[uint16]scsi.ALUAState]
	onALUA  func(map[uint16]scsi.ALUAState)
	stale   atomic.Bool   // the shared record changed: reload before use
	known   atomic.Uint64 // version, for the watch callback
	gate    writeGate     // writes checked against this copy, until they end
	// reloadFails counts the reloads that failed in a row, and retryAt
	// is when the next may be tried (p.mu).
	reloadFails uint64
	retryAt     time.Time
	log         *slog.Logger
	// notices are what a change in progress has for the registrants of
	// other front ends (prUA), told the unit once the change holds
	// (prChange).
	notices []pendingNotice
}

// pendingNotice is a reservation notice and the registrants it is for.
type pendingNotice struct {
	n     blockcore.ReservationNotice
	names []string
}

// After a reload of the shared record fails, commands use the last copy
// without asking the storage again until reloadBackoffMin has passed,
// then twice as long after each further failure, up to reloadBackoffMax:
// every command asked it before, under p.mu, so a cluster out of reach
// held each command of the LU for a timeout in turn.
const (
	reloadBackoffMin = 10 * time.Millisecond
	reloadBackoffMax = time.Second
)

// find returns the registration that covers nexus k: its own, or its
// initiator port's ALL_TG_PT one.
func (p *prState) find(k prKey) (prKey, uint64, bool) {
	if v, ok := p.regs[k]; ok {
		return k, v, true
	}
	all := prKey{ip: k.ip}
	if v, ok := p.regs[all]; ok {
		return all, v, true
	}
	// A registration made (by REGISTER AND MOVE) with an iSCSI
	// TransportID of the device-level form names the initiator, not one
	// of its ports.
	if name, _, cut := strings.Cut(k.ip, ",i,0x"); cut {
		dev := prKey{name, k.tp}
		if v, ok := p.regs[dev]; ok {
			return dev, v, true
		}
	}
	return k, 0, false
}

// prFile is the APTPL file's contents, and the shared record's.
type prFile struct {
	Generation uint32        `json:"generation"`
	Regs       []prFileEntry `json:"registrations"`
	Type       uint8         `json:"type,omitempty"`
	Holder     *prFileEntry  `json:"holder,omitempty"`
	APTPL      bool          `json:"aptpl,omitempty"` // shared record only
	// Resets counts logical unit resets through any target (shared
	// record only): the others then report BUS DEVICE RESET FUNCTION
	// OCCURRED to their nexuses too (SAM-5 §6.3.2, every I_T nexus).
	Resets uint64 `json:"resets,omitempty"`
	// ALUA holds the target port group states set by SET TARGET PORT
	// GROUPS through any gateway (shared record only).
	ALUA []aluaEntry `json:"alua,omitempty"`
}

type aluaEntry struct {
	Group uint16 `json:"group"`
	State uint8  `json:"state"`
}

func (p *prState) encode() prFile {
	f := prFile{Generation: p.generation, Regs: []prFileEntry{}, APTPL: p.aptpl, Resets: p.resets}
	if p.shared != nil {
		for _, id := range slices.Sorted(maps.Keys(p.alua)) {
			f.ALUA = append(f.ALUA, aluaEntry{id, uint8(p.alua[id])})
		}
	}
	for _, k := range p.order {
		f.Regs = append(f.Regs, prFileEntry{k.ip, k.tp, p.regs[k]})
	}
	if p.rtype != 0 {
		f.Type, f.Holder = p.rtype, &prFileEntry{Initiator: p.holder.ip, Target: p.holder.tp}
	}
	return f
}

// check refuses a record no target writes — a reservation of a type SPC-4
// does not define (§6.16.4, table 212), a registration with key 0 or no
// initiator port, an ALUA state outside the four SPC-4 defines — so a
// damaged file is an error that names it, not a state commands trip over.
func (f *prFile) check() error {
	if f.Holder != nil && !prTypeDefined(f.Type) {
		return fmt.Errorf("reservation of type %d (SPC-4 defines 1, 3, 5, 6, 7 and 8)", f.Type)
	}
	for _, r := range f.Regs {
		if r.Initiator == "" || r.Key == 0 {
			return fmt.Errorf("registration %q with key %#x (a registration has an initiator port and a key other than 0)", r.Initiator, r.Key)
		}
	}
	for _, e := range f.ALUA {
		if scsi.ALUAState(e.State) > scsi.Unavailable {
			return fmt.Errorf("target port group %d in ALUA state %d (0 to 3 are defined)", e.Group, e.State)
		}
	}
	return nil
}

// prTypeDefined reports whether SPC-4 defines reservation type t.
func prTypeDefined(t uint8) bool {
	switch t {
	case prWE, prEA, prWERO, prEARO, prWEAR, prEAAR:
		return true
	}
	return false
}

// parsePRFile decodes and checks an APTPL file or a shared record.
func parsePRFile(b []byte) (prFile, error) {
	var f prFile
	if err := json.Unmarshal(b, &f); err != nil {
		return f, err
	}
	return f, f.check()
}

// decode replaces the state with f's.
func (p *prState) decode(f *prFile) {
	p.generation, p.regs, p.order, p.rtype, p.holder = f.Generation, nil, nil, 0, prKey{}
	for _, r := range f.Regs {
		p.register(prKey{r.Initiator, r.Target}, r.Key)
	}
	if f.Holder != nil {
		p.rtype, p.holder = f.Type, prKey{f.Holder.Initiator, f.Holder.Target}
	}
	p.aptpl = f.APTPL
	p.resets = f.Resets
	p.alua = nil
	for _, e := range f.ALUA {
		if p.alua == nil {
			p.alua = map[uint16]scsi.ALUAState{}
		}
		p.alua[e.Group] = scsi.ALUAState(e.State)
	}
	if p.alua != nil {
		rec := maps.Clone(p.alua)
		p.aluaRec.Store(&rec)
	} else {
		p.aluaRec.Store(nil)
	}
}

// freshen reloads a shared state that another target changed: at the
// start of every command, so that a reset or reservation made elsewhere
// is in force (and its unit attention pending) before this one runs.
func (p *prState) freshen() {
	if p.shared == nil || !p.stale.Load() {
		return
	}
	p.mu.Lock()
	p.fresh()
	p.mu.Unlock()
}

// canPersist reports PTPL_C: whether APTPL can be honoured.
func (p *prState) canPersist() bool { return p.file != "" || p.shared != nil }

// attachShared makes the state the shared record of storage s, loaded now
// and reloaded whenever another target changes it.
func (p *prState) attachShared(s backend.SharedState, log *slog.Logger) error {
	p.shared, p.log = s, log
	if err := s.WatchState(func(v uint64) {
		if v == 0 || v != p.known.Load() {
			p.stale.Store(true)
			// Acknowledged once the writes checked against the old copy
			// have ended (writeGate).
			if !p.gate.settle(settleWait) && log != nil {
				log.Warn("persistent reservations: writes checked against the old shared state still running; acknowledging the change anyway", "waited", settleWait)
			}
		}
	}); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refresh(true)
}

// refresh reloads the shared record if it changed (or always, with
// force). Called with p.mu held.
func (p *prState) refresh(force bool) error {
	if p.shared == nil || !force && !p.stale.Load() {
		return nil
	}
	p.stale.Store(false) // a change notified from now on sets it again
	b, ver, err := p.shared.LoadState()
	if err != nil {
		p.stale.Store(true)
		return err
	}
	if ver == p.version && !force {
		return nil
	}
	var f prFile
	if len(b) > 0 {
		if f, err = parsePRFile(b); err != nil {
			p.stale.Store(true)
			return fmt.Errorf("shared reservation record: %w", err)
		}
	}
	before, loaded, aluaBefore := p.resets, p.version != 0, p.alua
	p.decode(&f)
	p.version = ver
	p.known.Store(ver)
	if loaded && p.resets != before && p.onReset != nil {
		p.onReset()
	}
	if !maps.Equal(aluaBefore, p.alua) && p.onALUA != nil {
		p.onALUA(p.alua)
	}
	return nil
}

// fresh brings a shared state up to date before it is used; when the
// storage cannot be read the last copy is used (commands that need the
// storage fail on their own). Called with p.mu held.
// After a failure it tries again only once the backoff has passed
// (reloadBackoffMin, doubling to reloadBackoffMax). The first 16
// failures in a row are logged, then one in 1024 with the count, and the
// first success after them.
func (p *prState) fresh() {
	if p.reloadFails > 0 && time.Now().Before(p.retryAt) {
		return
	}
	err := p.refresh(false)
	if err == nil {
		if p.reloadFails > 0 && p.log != nil {
			p.log.Info("persistent reservations: shared record reloaded", "failures_before", p.reloadFails)
		}
		p.reloadFails = 0
		return
	}
	p.reloadFails++
	p.retryAt = time.Now().Add(min(reloadBackoffMin<<min(p.reloadFails-1, 10), reloadBackoffMax))
	if n := p.reloadFails; p.log != nil && logsample.Keep(n) {
		p.log.Warn("persistent reservations: shared record not reloaded; using the last copy", "err", err, "failures", n)
	}
}

// errSharedUnavailable: the shared record could not be read or written;
// the initiator may retry (LOGICAL UNIT COMMUNICATION FAILURE).
var errSharedUnavailable = &scsi.Sense{Key: scsi.SenseAbortedCommand, ASC: 0x08, ASCQ: 0x00, Bit: -1}

// change runs f, which changes the state (called with p.mu held), and
// keeps the result: in the APTPL file, or in the shared record — there
// on the newest state, running f again when another target stored first.
func (lu *LU) prChange(f func(p *prState) error) (err error) {
	p := &lu.pr
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notices = nil
	if p.shared == nil {
		if err := f(p); err != nil {
			return err
		}
		if err := p.persist(); err != nil {
			lu.dev.log.Error("persistent reservations not saved", "lun", lu.lun, "file", p.file, "err", err)
			return scsi.MediumError(true, 0)
		}
		lu.tellNotices()
		return nil
	}
	defer func() {
		// What the change that held left; nothing of one that failed.
		if err != nil {
			p.notices = nil
		}
		lu.tellNotices()
	}()
	for attempt := 0; ; attempt++ {
		p.notices = nil
		if err := p.refresh(true); err != nil {
			lu.dev.log.Error("persistent reservations: reading the shared record", "lun", lu.lun, "err", err)
			return errSharedUnavailable
		}
		before := p.encode()
		if err := f(p); err != nil {
			p.decode(&before)
			return err
		}
		after := p.encode()
		b, err := json.Marshal(&after)
		if err != nil {
			p.decode(&before)
			return err
		}
		if old, _ := json.Marshal(&before); bytes.Equal(old, b) {
			return nil // nothing changed
		}
		ver, err := p.shared.StoreState(b, p.version)
		if err == nil {
			p.version = ver
			p.known.Store(ver)
			return nil
		}
		p.decode(&before)
		p.notices = nil
		if errors.Is(err, backend.ErrStale) && attempt < 64 {
			// Another target stored first: run again on its record,
			// after a random pause that grows with the attempts, so
			// targets racing on one LU do not keep overtaking one
			// another (four gateways registering at once lost 16 races
			// in a row now and then).
			time.Sleep(rand.N(50 * time.Microsecond << min(attempt, 8)))
			continue
		}
		lu.dev.log.Error("persistent reservations: storing the shared record", "lun", lu.lun, "err", err)
		return errSharedUnavailable
	}
}

type prFileEntry struct {
	Initiator string `json:"initiator"`
	Target    string `json:"target,omitempty"` // empty: all target ports
	Key       uint64 `json:"key,omitempty"`
}

func (p *prState) load() error {
	if p.file == "" {
		return nil
	}
	b, err := os.ReadFile(p.file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	f, err := parsePRFile(b)
	if err != nil {
		return fmt.Errorf("%s: %w", p.file, err)
	}
	p.decode(&f)
	p.aptpl = true // implied by the file
	return nil
}

// persist writes the state when APTPL is in force, or removes the file
// when it is not (SPC-4 §5.13.4: the last APTPL value decides). Called
// with p.mu held.
func (p *prState) persist() error {
	if p.file == "" {
		return nil
	}
	if !p.aptpl {
		return atomicfile.Remove(p.file)
	}
	f := p.encode()
	f.APTPL = false // implied by the file
	b, err := json.MarshalIndent(&f, "", "  ")
	if err != nil {
		return err
	}
	// Synced, renamed into place, directory synced: a confirmed APTPL
	// registration survives power loss; 0600, the keys are secrets.
	return atomicfile.WriteFile(p.file, b, 0o600)
}

func (p *prState) allRegistrants() bool { return p.rtype == prWEAR || p.rtype == prEAAR }

func (p *prState) isHolder(k prKey) bool {
	if p.rtype == 0 {
		return false
	}
	rk, _, ok := p.find(k)
	if p.allRegistrants() {
		return ok
	}
	return ok && p.holder == rk
}

func (p *prState) unregister(k prKey) {
	delete(p.regs, k)
	for i, o := range p.order {
		if o == k {
			p.order = append(p.order[:i], p.order[i+1:]...)
			break
		}
	}
}

func (p *prState) register(k prKey, key uint64) {
	if p.regs == nil {
		p.regs = map[prKey]uint64{}
	}
	if _, ok := p.regs[k]; !ok {
		p.order = append(p.order, k)
	}
	p.regs[k] = key
}

// prCheck is prConflict for a command about to run. A write on a LU whose
// state is shared with other gateways enters the write gate after its
// check (gated: it leaves with lu.pr.gate.leave(epoch) once it ended).
func (lu *LU) prCheck(n *Nexus, o *opInfo) (conflict, gated bool, epoch uint64) {
	p := &lu.pr
	if p.shared == nil || !o.writes {
		return lu.prConflict(n, o), false, 0
	}
	for {
		e := p.gate.current()
		if lu.prConflict(n, o) {
			return true, false, 0
		}
		if p.gate.enter(e) {
			return false, true, e
		}
	}
}

// prConflict reports whether a command from n conflicts with the LU's
// persistent reservation (SPC-4 §5.13.1, table of commands allowed in the
// presence of persistent reservations, simplified to its two classes).
func (lu *LU) prConflict(n *Nexus, o *opInfo) bool {
	return lu.prConflictKey(keyOf(n), o.prAllowed, o.writes || o.prWrite)
}

// prConflictKey is prConflict for the registration key k: allowed, a
// command allowed under every reservation; writes, one that changes the
// medium.
func (lu *LU) prConflictKey(k prKey, allowed, writes bool) bool {
	p := &lu.pr
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fresh()
	if p.rtype == 0 || allowed {
		return false
	}
	if p.isHolder(k) {
		return false
	}
	_, _, registered := p.find(k)
	switch p.rtype {
	case prWERO, prEARO:
		if registered {
			return false
		}
	}
	exclusiveAccess := p.rtype == prEA || p.rtype == prEARO || p.rtype == prEAAR
	if exclusiveAccess {
		return true
	}
	return writes
}

// prRegistered reports whether any registration exists (SPC-2 RESERVE and
// RELEASE conflict with persistent reservations, SPC-4 §5.13.3).
func (lu *LU) prActive() bool {
	lu.pr.mu.Lock()
	defer lu.pr.mu.Unlock()
	lu.pr.fresh()
	return len(lu.pr.regs) > 0
}

func cmdPRIn(lu *LU, c *Command) error {
	if c.Nexus == nil {
		return scsi.InvalidOpcode()
	}
	alloc := int(binary.BigEndian.Uint16(c.CDB[7:9]))
	p := &lu.pr
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fresh()
	var b []byte
	switch c.CDB[1] & 0x1f {
	case 0: // READ KEYS
		b = make([]byte, 8, 8+8*len(p.order))
		binary.BigEndian.PutUint32(b, p.generation)
		for _, k := range p.order {
			b = binary.BigEndian.AppendUint64(b, p.regs[k])
		}
		binary.BigEndian.PutUint32(b[4:], uint32(len(b)-8))
	case 1: // READ RESERVATION
		b = make([]byte, 8, 24)
		binary.BigEndian.PutUint32(b, p.generation)
		if p.rtype != 0 {
			var d [16]byte
			if !p.allRegistrants() {
				binary.BigEndian.PutUint64(d[0:], p.regs[p.holder])
			}
			d[13] = p.rtype // scope 0 (LU)
			b = append(b, d[:]...)
			binary.BigEndian.PutUint32(b[4:], 16)
		}
	case 2: // REPORT CAPABILITIES
		b = make([]byte, 8)
		binary.BigEndian.PutUint16(b, 8)
		b[2] = 0x10 | 0x08 | 0x04 // CRH: RESERVE/RELEASE(6/10) conflict-checked against PRs (SPC-4 §5.13.3); SIP_C; ATP_C
		if lu.pr.canPersist() {
			b[2] |= 0x01 // PTPL_C
		}
		b[3] = 0x80                             // TMV: the type mask is valid
		b[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02 // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX
		b[5] = 0x01                             // EX_AC_AR
	case 3: // READ FULL STATUS
		b = make([]byte, 8, 8+64*len(p.order))
		binary.BigEndian.PutUint32(b, p.generation)
		for _, k := range p.order {
			tid := transportID(k.ip)
			d := make([]byte, 24, 24+len(tid))
			binary.BigEndian.PutUint64(d, p.regs[k])
			if p.isHolder(k) {
				d[12] = 0x01 // R_HOLDER
				d[13] = p.rtype
			}
			binary.BigEndian.PutUint32(d[20:], uint32(len(tid)))
			b = append(append(b, d...), tid...)
		}
		binary.BigEndian.PutUint32(b[4:], uint32(len(b)-8))
	default:
		return scsi.InvalidFieldInCDB(1, 4)
	}
	c.putData(b, alloc)
	return nil
}

// transportID encodes an initiator port name as a TransportID (SPC-4
// §7.6.4): iSCSI's "name,i,0xISID" form, or SRP's 16-byte port ID.
func transportID(ip string) []byte {
	if strings.Contains(ip, ",i,0x") {
		n := len(ip) + 1
		n = (n + 3) &^ 3
		b := make([]byte, 4+n)
		b[0] = 0x40 | 0x05 // format 01b, protocol iSCSI
		binary.BigEndian.PutUint16(b[2:], uint16(n))
		copy(b[4:], ip)
		return b
	}
	b := make([]byte, 24)
	b[0] = 0x04 // SRP
	if len(ip) == 34 && strings.HasPrefix(ip, "0x") {
		hex.Decode(b[8:], []byte(ip[2:])) // a malformed name leaves zeroes
	}
	return b
}

var errPRConflict = errReservationConflict

// prUA establishes a unit attention on every nexus registered under one
// of keys (other than except) that is connected now.
func (lu *LU) prUA(keys map[prKey]bool, except prKey, s scsi.Sense) {
	lu.dev.forEachNexus(func(n *Nexus) {
		k := keyOf(n)
		if k != except && (keys[k] || keys[prKey{ip: k.ip}]) {
			n.addUA(lu.lun, s)
		}
	})
	// The same for the registrants of other front ends (NVMe hosts
	// register through every port), once the change holds.
	var names []string
	for k := range keys {
		if k != except && k.tp == "" {
			names = append(names, k.ip)
		}
	}
	if len(names) == 0 {
		return
	}
	n := blockcore.ReservationPreempted
	switch s {
	case uaRegistrationsPreempted:
		n = blockcore.RegistrationPreempted
	case uaReservationsReleased:
		n = blockcore.ReservationReleased
	}
	lu.pr.notices = append(lu.pr.notices, pendingNotice{n, names})
}

// tellNotices tells the unit's watchers what the change left (p.mu held).
func (lu *LU) tellNotices() {
	for _, n := range lu.pr.notices {
		lu.unit.NotifyReservation(n.n, n.names)
	}
	lu.pr.notices = nil
}

var (
	uaReservationsPreempted  = scsi.Sense{Key: scsi.SenseUnitAttention, ASC: 0x2a, ASCQ: 0x03, Bit: -1}
	uaReservationsReleased   = scsi.Sense{Key: scsi.SenseUnitAttention, ASC: 0x2a, ASCQ: 0x04, Bit: -1}
	uaRegistrationsPreempted = scsi.Sense{Key: scsi.SenseUnitAttention, ASC: 0x2a, ASCQ: 0x05, Bit: -1}
)

func cmdPROut(lu *LU, c *Command) error {
	if c.Nexus == nil {
		return scsi.InvalidOpcode()
	}
	sa := c.CDB[1] & 0x1f
	scope, typ := c.CDB[2]>>4, c.CDB[2]&0x0f
	plen := int(binary.BigEndian.Uint32(c.CDB[5:9]))
	if sa > 8 {
		return scsi.InvalidFieldInCDB(1, 4)
	}
	if sa == 8 {
		// REPLACE LOST RESERVATION: reservations are never lost here
		// (APTPL keeps them in a file), so there is nothing to replace.
		return scsi.InvalidFieldInCDB(1, 4)
	}
	if sa == 7 {
		return lu.registerAndMove(c, plen, typ, scope)
	}
	if plen < 24 {
		return scsi.ParameterListLengthError()
	}
	c.Transfer = plen
	if len(c.Data) < plen {
		return scsi.ParameterListLengthError()
	}
	prm := c.Data[:24]
	resKey := binary.BigEndian.Uint64(prm[0:])
	saKey := binary.BigEndian.Uint64(prm[8:])
	flags := prm[20]
	// SPEC_I_PT (SPC-4 §6.16.3): a REGISTER that also registers the
	// initiator ports its TransportIDs name, after the basic 24 bytes.
	var others []string
	if flags&0x08 != 0 {
		if sa != 0 {
			return scsi.InvalidFieldInParameterList(20, 3)
		}
		if plen < 28 {
			return scsi.ParameterListLengthError()
		}
		n := int(binary.BigEndian.Uint32(c.Data[24:28]))
		if n != plen-28 {
			return scsi.ParameterListLengthError()
		}
		var ok bool
		if others, ok = splitTransportIDs(c.Data[28:plen]); !ok {
			return scsi.InvalidFieldInParameterList(28, -1)
		}
	} else if plen != 24 {
		return scsi.ParameterListLengthError()
	}
	allTgPt := flags&0x04 != 0
	aptpl := flags&0x01 != 0
	if aptpl && !lu.pr.canPersist() { // PTPL_C 0: nowhere to keep it
		return scsi.InvalidFieldInParameterList(20, 0)
	}
	needType := sa == 1 || sa == 2 || sa == 4 || sa == 5
	if needType {
		if scope != 0 {
			return scsi.InvalidFieldInCDB(2, 7)
		}
		if !prTypeDefined(typ) {
			return scsi.InvalidFieldInCDB(2, 3)
		}
	}
	// PREEMPT AND ABORT ends the preempted nexuses' tasks before it
	// completes (SPC-4, PREEMPT AND ABORT), but waits for them only once the
	// state's lock is released: a task being aborted may be waiting for
	// that lock itself (its reservation check, prConflict), and waiting
	// under it deadlocked the LU (found by test/torture).
	var aborted []*sync.WaitGroup
	err := lu.prChange(func(p *prState) error {
		k, cur, registered := p.find(keyOf(c.Nexus))
		if others != nil {
			return p.registerSpecified(k, registered, resKey, saKey, others, allTgPt, aptpl)
		}
		return lu.prOut(c, sa, typ, k, cur, registered, resKey, saKey, allTgPt, aptpl, &aborted)
	})
	for _, wg := range aborted {
		wg.Wait()
	}
	if err == nil && sa == 5 {
		// The preempted NVMe hosts' writes too (prunit.go).
		lu.fenceOtherWrites()
	}
	return err
}

// registerSpecified is REGISTER with SPEC_I_PT: the unregistered nexus k
// and the initiator ports others name are registered with saKey — each
// with the target port k came through, or with every target port under
// ALL_TG_PT — all or none. Called with p.mu held.
func (p *prState) registerSpecified(k prKey, registered bool, resKey, saKey uint64, others []string, allTgPt, aptpl bool) error {
	if registered {
		// Only an unregistered nexus names others (as LIO answers).
		return scsi.InvalidFieldInParameterList(20, 3)
	}
	if resKey != 0 {
		return errPRConflict
	}
	if saKey == 0 {
		return nil // nothing to register
	}
	tp := k.tp
	if allTgPt {
		tp = ""
	}
	keys := []prKey{{k.ip, tp}}
	for _, ip := range others {
		o := prKey{ip, tp}
		if slices.Contains(keys, o) {
			continue // the sender itself, or named twice
		}
		if _, _, taken := p.find(o); taken {
			return scsi.InvalidFieldInParameterList(28, -1)
		}
		keys = append(keys, o)
	}
	for _, o := range keys {
		p.register(o, saKey)
	}
	p.generation++
	p.aptpl = aptpl
	return nil
}

// prOut carries out a PERSISTENT RESERVE OUT service action for the
// registration k (the nexus's own or its ALL_TG_PT one). Called with
// lu.pr.mu held.
//
// The tasks a PREEMPT AND ABORT aborted are added to aborted, for the
// caller to wait for once p.mu is released.
func (lu *LU) prOut(c *Command, sa, typ byte, k prKey, cur uint64, registered bool, resKey, saKey uint64, allTgPt, aptpl bool,
	aborted *[]*sync.WaitGroup) error {
	p := &lu.pr
	switch sa {
	case 0, 6: // REGISTER, REGISTER AND IGNORE EXISTING KEY
		if sa == 0 {
			if !registered && resKey != 0 || registered && resKey != cur {
				return errPRConflict
			}
		}
		if !registered {
			if saKey != 0 {
				if allTgPt {
					k.tp = ""
				}
				p.register(k, saKey)
				p.generation++
				p.aptpl = aptpl
			}
			return nil
		}
		p.generation++
		if saKey != 0 {
			p.regs[k] = saKey
			p.aptpl = aptpl
			return nil
		}
		// Unregister; a holder's reservation goes with it (for the
		// all-registrants types, with the last registrant).
		wasHolder := p.isHolder(k)
		p.unregister(k)
		if wasHolder && (!p.allRegistrants() || len(p.regs) == 0) {
			t := p.rtype
			p.rtype, p.holder = 0, prKey{}
			if t == prWERO || t == prEARO {
				lu.prUA(p.regSet(), k, uaReservationsReleased)
			}
		}
		return nil
	}
	if !registered || resKey != cur {
		return errPRConflict
	}
	switch sa {
	case 1: // RESERVE
		if p.rtype == 0 {
			p.rtype, p.holder = typ, k
			return nil
		}
		if p.isHolder(k) && p.rtype == typ {
			return nil
		}
		return errPRConflict
	case 2: // RELEASE
		if p.rtype == 0 || !p.isHolder(k) {
			return nil
		}
		if p.rtype != typ {
			return &scsi.Sense{Key: scsi.SenseIllegalRequest, ASC: 0x26, ASCQ: 0x04, Bit: -1} // INVALID RELEASE OF PERSISTENT RESERVATION
		}
		t := p.rtype
		p.rtype, p.holder = 0, prKey{}
		if t != prWE && t != prEA {
			lu.prUA(p.regSet(), k, uaReservationsReleased)
		}
		return nil
	case 3: // CLEAR
		others := p.regSet()
		p.regs, p.order = nil, nil
		p.rtype, p.holder = 0, prKey{}
		p.generation++
		lu.prUA(others, k, uaReservationsPreempted)
		return nil
	case 4, 5: // PREEMPT, PREEMPT AND ABORT
		victims := map[prKey]bool{}
		switch {
		case p.rtype == 0 || p.allRegistrants() && saKey != 0 || !p.allRegistrants() && saKey != p.regs[p.holder]:
			// Only registrations are preempted.
			if saKey == 0 {
				return scsi.InvalidFieldInParameterList(8, -1)
			}
			for o, v := range p.regs {
				if v == saKey {
					victims[o] = true
				}
			}
			if len(victims) == 0 {
				return errPRConflict
			}
		case p.allRegistrants():
			// SARK 0 against an all-registrants reservation: everyone
			// else is preempted and the reservation taken.
			for o := range p.regs {
				if o != k {
					victims[o] = true
				}
			}
			p.rtype, p.holder = typ, k
		default:
			// SARK is the holder's key: its registrations go, the
			// reservation is ours with the new type.
			for o, v := range p.regs {
				if v == saKey && o != k {
					victims[o] = true
				}
			}
			p.rtype, p.holder = typ, k
		}
		for o := range victims {
			p.unregister(o)
		}
		p.generation++
		lu.prUA(victims, k, uaRegistrationsPreempted)
		if sa == 5 && len(victims) > 0 {
			*aborted = append(*aborted, lu.abortMatching(func(t *Command) bool {
				if t.Nexus == nil {
					return false
				}
				k := keyOf(t.Nexus)
				return victims[k] || victims[prKey{ip: k.ip}]
			}, c))
		}
		return nil
	}
	return scsi.InvalidFieldInCDB(1, 4)
}

func (p *prState) regSet() map[prKey]bool {
	m := make(map[prKey]bool, len(p.regs))
	for k := range p.regs {
		m[k] = true
	}
	return m
}

// registerAndMove is PERSISTENT RESERVE OUT REGISTER AND MOVE (SPC-4
// §5.13.8): the holder registers another I_T nexus — named by a
// TransportID and a relative target port — with the service action key
// and hands it the reservation, unregistering itself when UNREG is set.
func (lu *LU) registerAndMove(c *Command, plen int, typ, scope byte) error {
	if plen < 24 {
		return scsi.ParameterListLengthError()
	}
	c.Transfer = plen
	if len(c.Data) < plen {
		return scsi.ParameterListLengthError()
	}
	prm := c.Data[:plen]
	resKey := binary.BigEndian.Uint64(prm[0:])
	saKey := binary.BigEndian.Uint64(prm[8:])
	unreg, aptpl := prm[17]&0x02 != 0, prm[17]&0x01 != 0
	relPort := binary.BigEndian.Uint16(prm[18:20])
	tidLen := int(binary.BigEndian.Uint32(prm[20:24]))
	if 24+tidLen > plen {
		return scsi.ParameterListLengthError()
	}
	if scope != 0 {
		return scsi.InvalidFieldInCDB(2, 7)
	}
	if aptpl && !lu.pr.canPersist() {
		return scsi.InvalidFieldInParameterList(17, 0)
	}
	ip, ok := parseTransportID(prm[24 : 24+tidLen])
	if !ok {
		return scsi.InvalidFieldInParameterList(24, -1)
	}
	// The destination's target port, by its relative port identifier.
	tp := ""
	lu.dev.forEachNexus(func(n *Nexus) {
		if n.RelativePort == relPort && tp == "" {
			tp = n.TargetPort
		}
	})
	if tp == "" {
		return scsi.InvalidFieldInParameterList(18, -1)
	}
	dst := prKey{ip, tp}
	return lu.prChange(func(p *prState) error { return p.move(c.Nexus, dst, resKey, saKey, typ, unreg, aptpl) })
}

// move is REGISTER AND MOVE's change. Called with p.mu held.
func (p *prState) move(n *Nexus, dst prKey, resKey, saKey uint64, typ byte, unreg, aptpl bool) error {
	k, cur, registered := p.find(keyOf(n))
	if !registered || resKey != cur {
		return errPRConflict
	}
	if p.rtype == 0 || p.allRegistrants() || p.holder != k {
		return errPRConflict // only the holder of a one-holder reservation moves it
	}
	if saKey == 0 {
		return scsi.InvalidFieldInParameterList(8, -1)
	}
	if dst == k || dst == keyOf(n) {
		return scsi.InvalidFieldInParameterList(24, -1) // moving to itself
	}
	p.register(dst, saKey)
	p.holder = dst
	if typ != 0 {
		p.rtype = typ
	}
	if unreg {
		p.unregister(k)
	}
	p.aptpl = aptpl
	p.generation++
	return nil
}

// splitTransportIDs reads the TransportIDs of a SPEC_I_PT list, each as
// parseTransportID does: an iSCSI one is 4 bytes and its ADDITIONAL
// LENGTH (a multiple of 4), an SRP one 24 bytes.
func splitTransportIDs(b []byte) ([]string, bool) {
	out := []string{}
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, false
		}
		n := 24
		if b[0]&0x0f == 0x05 {
			n = 4 + int(binary.BigEndian.Uint16(b[2:4]))
			if n%4 != 0 {
				return nil, false
			}
		}
		if n > len(b) {
			return nil, false
		}
		ip, ok := parseTransportID(b[:n])
		if !ok {
			return nil, false
		}
		out = append(out, ip)
		b = b[n:]
	}
	return out, len(out) > 0
}

// parseTransportID reads an iSCSI TransportID (SPC-4 §7.6.4.6): format
// 00b (the initiator's name: device-level, matched as the name) or 01b
// (name,i,0xISID: the initiator port). SRP's (protocol 4) is its 16-byte
// port identifier.
func parseTransportID(b []byte) (string, bool) {
	if len(b) < 4 {
		return "", false
	}
	switch b[0] & 0x0f {
	case 0x05: // iSCSI
		n := int(binary.BigEndian.Uint16(b[2:4]))
		if 4+n > len(b) || n == 0 {
			return "", false
		}
		name := string(bytes.TrimRight(b[4:4+n], "\x00"))
		return name, name != ""
	case 0x04: // SRP
		if len(b) < 24 {
			return "", false
		}
		return fmt.Sprintf("0x%x", b[8:24]), true
	}
	return "", false
}
