package nvmetarget

import (
	"bytes"
	"encoding/binary"
	"errors"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/nvme"
)

// More statuses of the NVM command set.
var (
	statusSGLLength      = nvme.MakeStatus(nvme.SCTGeneric, 0x0f, true) // Data SGL Length Invalid
	statusWriteProtected = nvme.MakeStatus(nvme.SCTGeneric, 0x20, true) // Namespace is Write Protected
	statusWriteFault     = nvme.MakeStatus(nvme.SCTMedia, 0x80, false)
	statusReadError      = nvme.MakeStatus(nvme.SCTMedia, 0x81, false) // Unrecovered Read Error
)

// ioError is the status of a failed backend call: storage out of reach
// for now is retried (Namespace Not Ready), anything else is the
// medium's.
func ioError(err error, write bool) nvme.Status {
	switch {
	case errors.Is(err, backend.ErrUnavailable):
		return nvme.StatusNamespaceNotReady
	case write:
		return statusWriteFault
	}
	return statusReadError
}

// io executes an NVM command set command on an I/O queue.
func (q *Queue) io(c *nvme.Command, data []byte, u *blockcore.Unit) Result {
	if c.Fuse != nvme.FuseNone {
		// A fused command alone: its partner is missing (the transport
		// pairs them and calls ExecFused).
		return fail(nvme.StatusFusedMissing)
	}
	if st := q.c.s.anaRefuses(); st != 0 {
		return fail(st) // this path's state does not allow I/O: the host tries another
	}
	if c.Opcode == nvme.OpFlush {
		return q.flush(c)
	}
	if u == nil {
		u = q.c.s.namespace(q.c.hostNQN, c.NSID)
	}
	if u == nil {
		return fail(nvme.StatusInvalidNamespace)
	}
	switch c.Opcode {
	case nvme.OpRead, nvme.OpWrite, nvme.OpCompare, nvme.OpWriteZeroes, nvme.OpDatasetMgmt:
		// The write command group changes the medium; Read and Compare
		// are the read group (Base 2.0, "Command Behavior in the
		// Presence of a Reservation").
		r, ticket, ok := q.admit(u, c.Opcode != nvme.OpRead && c.Opcode != nvme.OpCompare)
		if !ok {
			return fail(statusReservationConflict)
		}
		var res Result
		if c.Opcode == nvme.OpDatasetMgmt {
			res = dsm(u, c, data)
		} else {
			res = rw(u, c, data, q.c.s.t.MaxTransfer())
		}
		if r != nil {
			r.Done(ticket)
		}
		return res
	case nvme.OpResvRegister, nvme.OpResvReport, nvme.OpResvAcquire, nvme.OpResvRelease:
		return q.resv(c, data, u)
	}
	return fail(nvme.StatusInvalidOpcode)
}

// flush executes Flush: of one namespace, or (NSID FFFFFFFFh) of every
// namespace the host sees.
func (q *Queue) flush(c *nvme.Command) Result {
	var units []*blockcore.Unit
	if c.NSID == 0xffffffff {
		for _, id := range q.c.s.Namespaces() {
			if u := q.c.s.namespace(q.c.hostNQN, id); u != nil {
				units = append(units, u)
			}
		}
	} else if u := q.c.s.namespace(q.c.hostNQN, c.NSID); u != nil {
		units = append(units, u)
	} else {
		return fail(nvme.StatusInvalidNamespace)
	}
	for _, u := range units {
		// Flush is of the write command group.
		r, ticket, ok := q.admit(u, true)
		if !ok {
			if c.NSID == 0xffffffff {
				continue // flush the namespaces the host may write
			}
			return fail(statusReservationConflict)
		}
		err := u.Store().Flush()
		if r != nil {
			r.Done(ticket)
		}
		if err != nil {
			return fail(ioError(err, true))
		}
	}
	return Result{}
}

// rw executes Read, Write, Compare and Write Zeroes: the starting LBA in
// CDW10–11, the blocks less one in CDW12 bits 15:0, FUA in bit 30 (Write
// Zeroes: deallocate in bit 25).
func rw(u *blockcore.Unit, c *nvme.Command, data []byte, maxTransfer int) Result {
	slba := uint64(c.CDW[0]) | uint64(c.CDW[1])<<32
	nlb := uint64(c.CDW[2]&0xffff) + 1
	fua := c.CDW[2]&(1<<30) != 0
	if slba+nlb > u.Blocks() || slba+nlb < slba {
		return fail(nvme.StatusLBAOutOfRange)
	}
	off, n := int64(slba)<<u.BlockBits(), int64(nlb)<<u.BlockBits()
	if c.Opcode == nvme.OpWriteZeroes {
		if u.ReadOnly() {
			return fail(statusWriteProtected)
		}
		if err := u.WriteZeroes(off, n, fua || !u.Store().WriteCache()); err != nil {
			return fail(ioError(err, true))
		}
		return Result{}
	}
	if n > int64(maxTransfer) {
		return fail(nvme.StatusInvalidField)
	}
	if int64(len(data)) != n {
		return fail(statusSGLLength)
	}
	switch c.Opcode {
	case nvme.OpRead:
		if _, err := u.Backend().ReadAt(data, off); err != nil {
			return fail(ioError(err, false))
		}
		return Result{N: int(n)}
	case nvme.OpWrite:
		if u.ReadOnly() {
			return fail(statusWriteProtected)
		}
		if err := u.Store().Write(data, off, fua); err != nil {
			return fail(ioError(err, true))
		}
		return Result{}
	}
	// Compare: the blocks against the data, as one read.
	got := make([]byte, n)
	if _, err := u.Backend().ReadAt(got, off); err != nil {
		return fail(ioError(err, false))
	}
	if !bytes.Equal(got, data) {
		return fail(nvme.StatusCompareFailure)
	}
	return Result{}
}

// dsm executes Dataset Management: with the deallocate attribute (CDW11
// bit 2), each range (16 bytes: attributes, blocks, starting LBA) is
// released where the backend can; the other attributes are hints.
func dsm(u *blockcore.Unit, c *nvme.Command, data []byte) Result {
	nr := int(c.CDW[0]&0xff) + 1
	if len(data) < 16*nr {
		return fail(statusSGLLength)
	}
	if c.CDW[1]&(1<<2) == 0 {
		return Result{}
	}
	if u.ReadOnly() {
		return fail(statusWriteProtected)
	}
	for i := range nr {
		r := data[16*i:]
		nlb := uint64(binary.LittleEndian.Uint32(r[4:]))
		slba := binary.LittleEndian.Uint64(r[8:])
		if slba+nlb > u.Blocks() || slba+nlb < slba {
			return fail(nvme.StatusLBAOutOfRange)
		}
	}
	for i := range nr {
		r := data[16*i:]
		nlb := uint64(binary.LittleEndian.Uint32(r[4:]))
		slba := binary.LittleEndian.Uint64(r[8:])
		if nlb == 0 {
			continue
		}
		err := u.Unmap(int64(slba)<<u.BlockBits(), int64(nlb)<<u.BlockBits())
		if err != nil && err != blockcore.ErrNoUnmap {
			return fail(ioError(err, true))
		}
	}
	return Result{}
}

// ExecFused executes a fused Compare (first) and Write (second) as one
// operation (NVMe Base 2.0, "Fused Operations"): the write happens only
// if the compare matched, atomically against every other write to the
// namespace (blockcore.Store.CompareAndWrite). Both commands are
// answered: on a mismatch the Compare with Compare Failure and the
// Write with Command Aborted due to Failed Fused Command.
func (q *Queue) ExecFused(first *nvme.Command, firstData []byte, second *nvme.Command, secondData []byte) (Result, Result) {
	start := q.c.since()
	a, b, u := q.execFused(first, firstData, second, secondData)
	st := a.CQE.Status
	if st == 0 {
		st = b.CQE.Status
	}
	// One command, as SCSI's COMPARE AND WRITE is.
	q.count(nvme.OpCompare, u, 0, st, q.c.since()-start)
	return a, b
}

// execFused is ExecFused, and the unit it ran on (nil: none).
func (q *Queue) execFused(first *nvme.Command, firstData []byte, second *nvme.Command, secondData []byte) (Result, Result, *blockcore.Unit) {
	abort := Result{CQE: nvme.Completion{Status: nvme.StatusFusedFailed}}
	if !q.authenticated() {
		return fail(statusAuthRequired), abort, nil
	}
	if st := q.c.s.anaRefuses(); st != 0 {
		return fail(st), abort, nil
	}
	if q.qid == 0 || first.Opcode != nvme.OpCompare || second.Opcode != nvme.OpWrite || first.NSID != second.NSID ||
		first.CDW[0] != second.CDW[0] || first.CDW[1] != second.CDW[1] || first.CDW[2]&0xffff != second.CDW[2]&0xffff {
		// Not a Compare and a Write of the same blocks.
		return fail(nvme.StatusInvalidField), abort, nil
	}
	u := q.c.s.namespace(q.c.hostNQN, first.NSID)
	if u == nil {
		return fail(nvme.StatusInvalidNamespace), abort, nil
	}
	if u.ReadOnly() {
		return fail(statusWriteProtected), abort, u
	}
	slba := uint64(first.CDW[0]) | uint64(first.CDW[1])<<32
	nlb := uint64(first.CDW[2]&0xffff) + 1
	if slba+nlb > u.Blocks() || slba+nlb < slba {
		return fail(nvme.StatusLBAOutOfRange), abort, u
	}
	n := int(nlb) << u.BlockBits()
	if len(firstData) != n || len(secondData) != n {
		return fail(statusSGLLength), abort, u
	}
	if n > q.c.s.t.o.fusedLimit(u) {
		return fail(nvme.StatusInvalidField), abort, u
	}
	fua := second.CDW[2]&(1<<30) != 0
	r, ticket, ok := q.admit(u, true)
	if !ok {
		return fail(statusReservationConflict), abort, u
	}
	if r != nil {
		defer r.Done(ticket)
	}
	readErr, err := u.Store().CompareAndWrite(firstData, secondData, int64(slba)<<u.BlockBits(), fua || !u.Store().WriteCache())
	var mis *backend.MiscompareError
	switch {
	case errors.As(err, &mis):
		return fail(nvme.StatusCompareFailure), abort, u
	case err != nil && readErr:
		return fail(ioError(err, false)), abort, u
	case err != nil:
		// The compare held; the write failed.
		return Result{}, fail(ioError(err, true)), u
	}
	return Result{}, Result{}, u
}

// fusedLimit is the most a fused Compare and Write may cover: on storage
// that compares and writes itself (shared between gateways), what it
// does atomically; else the largest transfer.
func (o *Options) fusedLimit(u *blockcore.Unit) int {
	if cw, ok := u.Backend().(backend.CompareWriter); ok && cw.MaxCompareAndWrite() >= u.BlockSize() {
		return cw.MaxCompareAndWrite()
	}
	return 4096 << o.MDTS
}
