package blockcore

import "errors"

// Reservations: one state per unit, every front end's registrants in it.
//
// SCSI persistent reservations (SPC-4 §5.13) and NVMe reservations (NVMe
// Base 2.0, "Reservations") are one model: registrants with keys, at
// most one reservation of six types, preemption by key. A SCSI LU and an
// NVMe namespace on the same image are one Unit, so they share one state:
// an NVMe host's Write Exclusive reservation refuses a SCSI initiator's
// writes and the other way round. The SCSI core keeps the state (with its
// persistence through power loss and its record shared between gateways
// on one image) and installs it on its unit; the NVMe controller model
// drives it through this interface.

// ReservationType is a reservation's type, numbered as NVMe numbers them
// (SCSI's codes are 1, 3, 5, 6, 7 and 8 for the same six).
type ReservationType uint8

// The six reservation types.
const (
	WriteExclusive ReservationType = 1 + iota
	ExclusiveAccess
	WriteExclusiveRegistrantsOnly
	ExclusiveAccessRegistrantsOnly
	WriteExclusiveAllRegistrants
	ExclusiveAccessAllRegistrants
)

// Defined reports whether t is one of the six types.
func (t ReservationType) Defined() bool {
	return t >= WriteExclusive && t <= ExclusiveAccessAllRegistrants
}

// RegisterAction is what a Register does.
type RegisterAction uint8

// Register actions (NVMe Reservation Register, RREGA).
const (
	// RegisterKey registers a new key; registering again with the same
	// key succeeds, with another it conflicts.
	RegisterKey RegisterAction = iota
	// UnregisterKey removes the registration (and a reservation it holds).
	UnregisterKey
	// ReplaceKey changes the key (with ignoreKey, registers if none).
	ReplaceKey
)

// AcquireAction is what an Acquire does.
type AcquireAction uint8

// Acquire actions (NVMe Reservation Acquire, RACQA).
const (
	Acquire AcquireAction = iota
	Preempt
	PreemptAndAbort
)

// Errors of the reservation verbs.
var (
	// ErrReservationConflict: the registrant's key or the reservation
	// does not allow it (NVMe Reservation Conflict, SCSI RESERVATION
	// CONFLICT).
	ErrReservationConflict = errors.New("reservation conflict")
	// ErrReservationInvalid: a field of the request is invalid (a new key
	// of 0, a preempt key of 0 where one is needed, a release of another
	// type than the reservation's, persistence where there is none).
	ErrReservationInvalid = errors.New("reservation request invalid")
)

// Registrant is one registration.
type Registrant struct {
	// Name is the front end's name of the registrant (NVMe: "nvme-host:"
	// and the host identifier in hex; SCSI: the initiator port).
	Name   string
	Key    uint64
	Holder bool // it holds the reservation (every registrant does with the all-registrants types)
}

// ReservationStatus is the state as a report shows it.
type ReservationStatus struct {
	Generation  uint32
	Type        ReservationType // 0: none
	Persist     bool            // the state persists through power loss
	Registrants []Registrant    // in registration order
}

// Reservations is a unit's reservation state. A registrant is named by
// its front end and registers through every port of the unit.
type Reservations interface {
	// Admit says whether a command from registrant name may run now
	// (write: it changes the medium). When ok, ticket is passed to Done
	// once the command ended (shared state holds writes that were
	// admitted against a copy until they end).
	Admit(name string, write bool) (ok bool, ticket uint64)
	Done(ticket uint64)
	// Register, Acquire and Release change the state; cur is the
	// registrant's current key (not checked with ignoreKey), key the new
	// key (Register) or the key to preempt (Acquire); persist is 0 to
	// leave persistence through power loss as it is, 1 to turn it off,
	// 2 on.
	Register(name string, action RegisterAction, cur, key uint64, ignoreKey bool, persist int) error
	Acquire(name string, action AcquireAction, t ReservationType, cur, key uint64) error
	Release(name string, clear bool, t ReservationType, cur uint64) error
	Status() ReservationStatus
	// CanPersist reports whether the state can persist through power loss.
	CanPersist() bool
}

// ReservationNotice is what happened to registrants, as NVMe's
// reservation notification log reports it (SCSI's unit attentions say the
// same: 2A/05, 2A/04, 2A/03).
type ReservationNotice uint8

// Reservation notices.
const (
	RegistrationPreempted ReservationNotice = 1 // their registration was preempted
	ReservationReleased   ReservationNotice = 2 // the reservation they were under was released
	ReservationPreempted  ReservationNotice = 3 // the reservation was preempted (or cleared)
)

// WatchReservations calls f with each notice and the names of the
// registrants it is for, once the change that made it holds. f runs
// with the state's lock held: it must not block, nor call the state.
func (u *Unit) WatchReservations(f func(n ReservationNotice, names []string)) (cancel func()) {
	return u.resvWatch.add(f)
}

// NotifyReservation is the state's keeper telling the watchers.
func (u *Unit) NotifyReservation(n ReservationNotice, names []string) {
	u.resvWatch.each(func(f func(ReservationNotice, []string)) { f(n, names) })
}

// SetReservations installs the unit's reservation state (its SCSI LU's,
// at creation); Reservations returns it, nil when none was installed.
func (u *Unit) SetReservations(r Reservations) { u.resv = r }

// Reservations returns the unit's reservation state (nil: none).
func (u *Unit) Reservations() Reservations { return u.resv }
