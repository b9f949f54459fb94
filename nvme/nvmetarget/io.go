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
func (q *Queue) io(c *nvme.Command, data []byte) Result {
	if c.Fuse != nvme.FuseNone {
		return fail(nvme.StatusInvalidField) // FUSES is 0: no fused operations
	}
	if c.Opcode == nvme.OpFlush {
		return q.flush(c)
	}
	u := q.c.s.namespace(q.c.hostNQN, c.NSID)
	if u == nil {
		return fail(nvme.StatusInvalidNamespace)
	}
	switch c.Opcode {
	case nvme.OpRead, nvme.OpWrite, nvme.OpCompare, nvme.OpWriteZeroes:
		return rw(u, c, data, q.c.s.t.MaxTransfer())
	case nvme.OpDatasetMgmt:
		return dsm(u, c, data)
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
		if err := u.Store().Flush(); err != nil {
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
