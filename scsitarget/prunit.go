package scsitarget

import (
	"errors"
	"fmt"
	"sync"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/scsi"
)

// The LU's persistent reservations as the unit's reservation state
// (blockcore.Reservations): what another front end on the same unit —
// the NVMe controller model — registers, acquires and checks against.
// One state, so a SCSI initiator's reservation binds NVMe hosts and an
// NVMe host's binds SCSI initiators; it persists and is shared between
// gateways as every SCSI registration is.
//
// A registrant named by another front end registers through every
// target port (as ALL_TG_PT does). NVMe's actions map onto SPC-4's:
// Register is REGISTER AND IGNORE EXISTING KEY with NVMe's checks before
// it (a registrant registering again must give its own key; a key of 0
// is invalid), Acquire is RESERVE, Preempt and Preempt and Abort are
// PREEMPT and PREEMPT AND ABORT (the preempted SCSI nexuses' tasks are
// aborted; an NVMe command already running completes), Release and Clear
// are RELEASE and CLEAR. SCSI nexuses keep getting their unit attentions.

// luReservations is lu's state as blockcore.Reservations.
type luReservations struct{ lu *LU }

var _ blockcore.Reservations = luReservations{}

// scsiType is SPC-4's code of t (0 for none).
func scsiType(t blockcore.ReservationType) byte {
	return [...]byte{0, prWE, prEA, prWERO, prEARO, prWEAR, prEAAR}[t]
}

// neutralType is the reservation type of SPC-4's code c.
func neutralType(c uint8) blockcore.ReservationType {
	switch c {
	case prWE:
		return blockcore.WriteExclusive
	case prEA:
		return blockcore.ExclusiveAccess
	case prWERO:
		return blockcore.WriteExclusiveRegistrantsOnly
	case prEARO:
		return blockcore.ExclusiveAccessRegistrantsOnly
	case prWEAR:
		return blockcore.WriteExclusiveAllRegistrants
	case prEAAR:
		return blockcore.ExclusiveAccessAllRegistrants
	}
	return 0
}

// resvError is the neutral error of one the SCSI verbs returned.
func resvError(err error) error {
	var s *scsi.Sense
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errPRConflict):
		return blockcore.ErrReservationConflict
	case err == errSharedUnavailable:
		return fmt.Errorf("reservations: the shared record is out of reach: %w", backend.ErrUnavailable)
	case errors.As(err, &s) && s.Key == scsi.SenseIllegalRequest:
		return blockcore.ErrReservationInvalid
	}
	return fmt.Errorf("reservations: %w", err)
}

// A write's ticket: holdsFence, and the write gate's epoch plus one (0:
// not in the gate).
const holdsFence = 1 << 63

// Admit checks a command against the state. A write holds lu.otherWrites
// shared from before its check until Done, so a PREEMPT AND ABORT (which
// waits for it exclusively once it changed the state) finds it either
// refused by the new state or ended.
func (r luReservations) Admit(name string, write bool) (bool, uint64) {
	lu := r.lu
	if lu.reservedByAny() {
		return false, 0 // an SPC-2 RESERVE by a SCSI nexus excludes everyone else
	}
	k := prKey{ip: name}
	p := &lu.pr
	if !write {
		return !lu.prConflictKey(k, false, false), 0
	}
	lu.otherWrites.RLock()
	if p.shared == nil {
		if lu.prConflictKey(k, false, true) {
			lu.otherWrites.RUnlock()
			return false, 0
		}
		return true, holdsFence
	}
	for {
		e := p.gate.current()
		if lu.prConflictKey(k, false, true) {
			lu.otherWrites.RUnlock()
			return false, 0
		}
		if p.gate.enter(e) {
			return true, holdsFence | (e + 1)
		}
	}
}

func (r luReservations) Done(ticket uint64) {
	if g := ticket &^ holdsFence; g != 0 {
		r.lu.pr.gate.leave(g - 1)
	}
	if ticket&holdsFence != 0 {
		r.lu.otherWrites.RUnlock()
	}
}

// fenceOtherWrites waits for the writes other front ends were running
// when the state changed (a PREEMPT AND ABORT): those admitted before it
// end first; those after it were checked against the new state.
func (lu *LU) fenceOtherWrites() {
	lu.otherWrites.Lock()
	//lint:ignore SA2001 the wait for the lock is the point: once held, every earlier write has ended
	lu.otherWrites.Unlock()
}

func (r luReservations) CanPersist() bool { return r.lu.pr.canPersist() }

func (r luReservations) Register(name string, action blockcore.RegisterAction, cur, key uint64, ignoreKey bool, persist int) error {
	lu := r.lu
	if persist == 2 && !lu.pr.canPersist() {
		return blockcore.ErrReservationInvalid
	}
	var aborted []*sync.WaitGroup
	err := lu.prChange(func(p *prState) error {
		k, have, registered := p.find(prKey{ip: name})
		aptpl := p.aptpl
		switch persist {
		case 1:
			aptpl = false
		case 2:
			aptpl = true
		}
		switch action {
		case blockcore.RegisterKey:
			if key == 0 {
				return blockcore.ErrReservationInvalid
			}
			if registered {
				if have != key {
					return errPRConflict
				}
				p.aptpl = aptpl
				return nil
			}
		case blockcore.UnregisterKey:
			if !registered || !ignoreKey && have != cur {
				return errPRConflict
			}
			key = 0
		case blockcore.ReplaceKey:
			if key == 0 {
				return blockcore.ErrReservationInvalid
			}
			if !registered && !ignoreKey || registered && !ignoreKey && have != cur {
				return errPRConflict
			}
		default:
			return blockcore.ErrReservationInvalid
		}
		err := lu.prOut(nil, 6, 0, k, have, registered, 0, key, true, aptpl, &aborted)
		p.aptpl = aptpl
		return err
	})
	for _, wg := range aborted {
		wg.Wait()
	}
	if errors.Is(err, blockcore.ErrReservationInvalid) {
		return err
	}
	return resvError(err)
}

func (r luReservations) Acquire(name string, action blockcore.AcquireAction, t blockcore.ReservationType, cur, key uint64) error {
	lu := r.lu
	if !t.Defined() {
		return blockcore.ErrReservationInvalid
	}
	sa := map[blockcore.AcquireAction]byte{blockcore.Acquire: 1, blockcore.Preempt: 4, blockcore.PreemptAndAbort: 5}[action]
	if sa == 0 {
		return blockcore.ErrReservationInvalid
	}
	var aborted []*sync.WaitGroup
	err := lu.prChange(func(p *prState) error {
		k, have, registered := p.find(prKey{ip: name})
		return lu.prOut(nil, sa, scsiType(t), k, have, registered, cur, key, false, p.aptpl, &aborted)
	})
	for _, wg := range aborted {
		wg.Wait()
	}
	if err == nil && action == blockcore.PreemptAndAbort {
		lu.fenceOtherWrites()
	}
	return resvError(err)
}

func (r luReservations) Release(name string, clear bool, t blockcore.ReservationType, cur uint64) error {
	lu := r.lu
	sa := byte(2)
	if clear {
		sa = 3
	} else if t != 0 && !t.Defined() {
		return blockcore.ErrReservationInvalid
	}
	var aborted []*sync.WaitGroup
	err := lu.prChange(func(p *prState) error {
		k, have, registered := p.find(prKey{ip: name})
		return lu.prOut(nil, sa, scsiType(t), k, have, registered, cur, 0, false, p.aptpl, &aborted)
	})
	return resvError(err)
}

func (r luReservations) Status() blockcore.ReservationStatus {
	p := &r.lu.pr
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fresh()
	st := blockcore.ReservationStatus{Generation: p.generation, Type: neutralType(p.rtype), Persist: p.aptpl}
	for _, k := range p.order {
		st.Registrants = append(st.Registrants, blockcore.Registrant{Name: k.ip, Key: p.regs[k], Holder: p.isHolder(k)})
	}
	return st
}
