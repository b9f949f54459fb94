// Package blockdev is the block-device view of one logical unit, over any
// SCSI initiator transport (iSCSI, iSER, SRP): capacity from READ
// CAPACITY, block-aligned reads and writes split into commands of a
// bounded size, SYNCHRONIZE CACHE and UNMAP, and unit attentions retried
// (they report events, not failures). It knows SCSI, not the transport.
package blockdev

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/blockwire/blockwire/scsi"
)

// Result is the outcome of a command that completed.
type Result struct {
	Status byte
	Sense  *scsi.Sense
	// Residual is the residual count: positive for underflow (less data
	// than expected), negative for overflow.
	Residual int
	// In is the number of data-in bytes received.
	In int
}

// SCSIError is a command that ended with a status other than GOOD.
type SCSIError struct {
	Status byte
	Sense  *scsi.Sense // nil without sense data
}

func (e *SCSIError) Error() string {
	if e.Sense != nil {
		return fmt.Sprintf("scsi: status %#02x: %v", e.Status, e.Sense)
	}
	return fmt.Sprintf("scsi: status %#02x", e.Status)
}

// Transport runs SCSI commands on a nexus: Do returns a *SCSIError (with
// the Result) for a status other than GOOD.
type Transport interface {
	Do(ctx context.Context, lun uint64, cdb []byte, out, in []byte) (Result, error)
	Close() error
}

// Device is a block device on one LUN of a Transport.
type Device struct {
	t         Transport
	name      string // for messages: "iscsi", "srp"
	lun       uint64
	blockSize int
	blocks    uint64
	maxXfer   int
	thin      bool // LBPME in READ CAPACITY(16): the LUN is thin provisioned
}

// Open probes lun on t (TEST UNIT READY, READ CAPACITY) and returns it as
// a block device moving at most maxXfer bytes per command. name prefixes
// error messages. On error t is left open.
func Open(ctx context.Context, t Transport, name string, lun uint64, maxXfer int) (*Device, error) {
	d := &Device{t: t, name: name, lun: lun, maxXfer: maxXfer}
	if err := d.probe(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// do runs a command, retrying unit attentions.
func (d *Device) do(ctx context.Context, cdb []byte, out, in []byte) (Result, error) {
	for try := 0; ; try++ {
		r, err := d.t.Do(ctx, d.lun, cdb, out, in)
		var se *SCSIError
		if try < 5 && errors.As(err, &se) && se.Sense != nil && se.Sense.Key == scsi.SenseUnitAttention {
			continue
		}
		return r, err
	}
}

func (d *Device) probe(ctx context.Context) error {
	if _, err := d.do(ctx, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil, nil); err != nil {
		return fmt.Errorf("%s: LUN %d: %w", d.name, d.lun, err)
	}
	buf := make([]byte, 32)
	cdb := []byte{scsi.OpServiceActionIn16, scsi.SAReadCapacity16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0}
	if _, err := d.do(ctx, cdb, nil, buf); err == nil {
		d.blocks = binary.BigEndian.Uint64(buf) + 1
		d.blockSize = int(binary.BigEndian.Uint32(buf[8:]))
		d.thin = buf[14]&0x80 != 0
	} else {
		b10 := make([]byte, 8)
		if _, err := d.do(ctx, []byte{scsi.OpReadCapacity10, 0, 0, 0, 0, 0, 0, 0, 0, 0}, nil, b10); err != nil {
			return fmt.Errorf("%s: READ CAPACITY: %w", d.name, err)
		}
		d.blocks = uint64(binary.BigEndian.Uint32(b10)) + 1
		d.blockSize = int(binary.BigEndian.Uint32(b10[4:]))
	}
	if d.blockSize < 512 || d.blockSize&(d.blockSize-1) != 0 {
		return fmt.Errorf("%s: implausible block size %d", d.name, d.blockSize)
	}
	return nil
}

// Size returns the capacity in bytes.
func (d *Device) Size() int64 { return int64(d.blocks) * int64(d.blockSize) }

// Thin reports whether the LUN is thin provisioned (LBPME, SBC-4
// §5.20.2): whether Unmap can work.
func (d *Device) Thin() bool { return d.thin }

// BlockSize returns the logical block size.
func (d *Device) BlockSize() int { return d.blockSize }

// LUN returns the logical unit number.
func (d *Device) LUN() uint64 { return d.lun }

func (d *Device) check(n int, off int64) error {
	bs := int64(d.blockSize)
	if off%bs != 0 || int64(n)%bs != 0 {
		return fmt.Errorf("%s: I/O of %d bytes at %d is not aligned to %d-byte blocks", d.name, n, off, bs)
	}
	if off < 0 || off+int64(n) > d.Size() {
		return fmt.Errorf("%s: I/O [%d,%d) beyond the LUN's %d bytes", d.name, off, off+int64(n), d.Size())
	}
	return nil
}

func rw16(op byte, lba uint64, blocks uint32) []byte {
	cdb := make([]byte, 16)
	cdb[0] = op
	binary.BigEndian.PutUint64(cdb[2:], lba)
	binary.BigEndian.PutUint32(cdb[10:], blocks)
	return cdb
}

// ReadAtContext reads len(p) bytes at off (block-aligned).
func (d *Device) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return d.transfer(ctx, scsi.OpRead16, p, off)
}

// WriteAtContext writes p at off (block-aligned).
func (d *Device) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return d.transfer(ctx, scsi.OpWrite16, p, off)
}

// transfer runs READ(16) or WRITE(16) over p in commands of at most
// maxXfer bytes.
func (d *Device) transfer(ctx context.Context, op byte, p []byte, off int64) (int, error) {
	if err := d.check(len(p), off); err != nil {
		return 0, err
	}
	done := 0
	for done < len(p) {
		n := min(len(p)-done, d.maxXfer)
		lba := uint64(off+int64(done)) / uint64(d.blockSize)
		var out, in []byte
		if op == scsi.OpWrite16 {
			out = p[done : done+n]
		} else {
			in = p[done : done+n]
		}
		if _, err := d.do(ctx, rw16(op, lba, uint32(n/d.blockSize)), out, in); err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// ReadAt implements io.ReaderAt.
func (d *Device) ReadAt(p []byte, off int64) (int, error) {
	return d.ReadAtContext(context.Background(), p, off)
}

// WriteAt implements io.WriterAt.
func (d *Device) WriteAt(p []byte, off int64) (int, error) {
	return d.WriteAtContext(context.Background(), p, off)
}

// Flush issues SYNCHRONIZE CACHE(16) for the whole LUN.
func (d *Device) Flush() error {
	_, err := d.do(context.Background(), []byte{scsi.OpSynchronizeCache16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, nil, nil)
	return err
}

// Unmap releases [off, off+length) (block-aligned) with UNMAP.
func (d *Device) Unmap(off, length int64) error {
	if err := d.check(int(length), off); err != nil {
		return err
	}
	param := make([]byte, 24)
	binary.BigEndian.PutUint16(param[0:], 22)
	binary.BigEndian.PutUint16(param[2:], 16)
	binary.BigEndian.PutUint64(param[8:], uint64(off)/uint64(d.blockSize))
	binary.BigEndian.PutUint32(param[16:], uint32(length/int64(d.blockSize)))
	_, err := d.do(context.Background(), []byte{scsi.OpUnmap, 0, 0, 0, 0, 0, 0, 0, 24, 0}, param, nil)
	return err
}

// Do passes a raw CDB to the LUN.
func (d *Device) Do(ctx context.Context, cdb []byte, out, in []byte) (Result, error) {
	return d.t.Do(ctx, d.lun, cdb, out, in)
}

// Close ends the transport's session.
func (d *Device) Close() error { return d.t.Close() }
