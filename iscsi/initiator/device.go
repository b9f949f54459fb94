package initiator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/iscsi/auth"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
	"github.com/blockwire/blockwire/scsi"
)

// URL is a parsed libiscsi-style iSCSI URL:
// iscsi://[user[%password]@]host[:port]/target-iqn/lun
type URL struct {
	User, Password string
	Portal         string // host:port
	Target         string
	LUN            uint64
	HasLUN         bool
	// ISER: the URL was iser://… (libiscsi's convention): connect with
	// iSER.
	ISER bool
}

// ParseURL parses an iSCSI URL, iscsi://[user[%password]@]host[:port]/
// target/lun, or the same with iser:// for iSER. The target and LUN may be
// omitted (for discovery).
func ParseURL(raw string) (*URL, error) {
	u := &URL{}
	rest, ok := strings.CutPrefix(raw, "iscsi://")
	if !ok {
		rest, ok = strings.CutPrefix(raw, "iser://")
		u.ISER = true
	}
	if !ok {
		return nil, fmt.Errorf("iscsi URL %q: must start with iscsi:// or iser://", raw)
	}
	hostEnd := strings.IndexByte(rest, '/')
	if hostEnd < 0 {
		hostEnd = len(rest)
	}
	if at := strings.LastIndexByte(rest[:hostEnd], '@'); at >= 0 {
		cred := rest[:at]
		rest = rest[at+1:]
		hostEnd -= at + 1
		user, pw, _ := strings.Cut(cred, "%")
		u.User, u.Password = user, pw
		if u.User == "" {
			return nil, fmt.Errorf("iscsi URL %q: empty user name", raw)
		}
	}
	host := rest[:hostEnd]
	if host == "" {
		return nil, fmt.Errorf("iscsi URL %q: no host", raw)
	}
	u.Portal = withPort(host)
	path := strings.Trim(rest[hostEnd:], "/")
	if path == "" {
		return u, nil
	}
	tgt, lun, hasLUN := strings.Cut(path, "/")
	u.Target = tgt
	if hasLUN {
		n, err := strconv.ParseUint(lun, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("iscsi URL %q: bad LUN %q", raw, lun)
		}
		u.LUN, u.HasLUN = n, true
	}
	return u, nil
}

// Credentials returns the URL's CHAP credentials, or nil.
func (u *URL) Credentials() *auth.Credentials {
	if u.User == "" {
		return nil
	}
	return &auth.Credentials{User: u.User, Secret: u.Password}
}

// DiscoveredTarget is one SendTargets answer.
type DiscoveredTarget struct {
	Name      string
	Addresses []string // "host:port,tpgt"
}

// Discover runs a discovery session and asks for SendTargets=All.
func Discover(ctx context.Context, portal string, opts Options) ([]DiscoveredTarget, error) {
	opts.defaults()
	s := &Session{opts: opts, portal: withPort(portal), isid: newISID(), log: opts.Logger, tasks: map[uint32]*task{}, tmfs: map[uint32]chan byte{}, cmdSN: 1, nextITT: 1}
	s.cond = newCond(s)
	l, err := s.connect(ctx, true, 0)
	if err != nil {
		return nil, err
	}
	s.links = []*link{l}
	defer s.Close()
	var all []byte
	ttt := uint32(pdu.ReservedTTT)
	kvs := text.Append(nil, text.KV{Key: "SendTargets", Value: "All"})
	for range 1000 {
		req := pdu.TextReq{Immediate: true, Final: true, ITT: 1, TTT: ttt, CmdSN: s.cmdSN}
		var p datamover.PDU
		req.Encode(&p.BHS)
		p.Data = kvs
		kvs = nil
		if err := l.dm.SendControl(&p, false); err != nil {
			return nil, err
		}
		var rp *datamover.PDU
		select {
		case rp = <-l.textCh:
		case <-l.done:
			select {
			case rp = <-l.textCh:
			default:
				return nil, errors.New("iscsi: discovery connection closed")
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		var r pdu.TextResp
		if err := r.Decode(&rp.BHS); err != nil {
			return nil, err
		}
		all = append(all, rp.Data...)
		if r.Final {
			break
		}
		ttt = r.TTT
	}
	pairs, err := text.Parse(all)
	if err != nil {
		return nil, err
	}
	var out []DiscoveredTarget
	for _, kv := range pairs {
		switch kv.Key {
		case "TargetName":
			out = append(out, DiscoveredTarget{Name: kv.Value})
		case "TargetAddress":
			if len(out) > 0 {
				out[len(out)-1].Addresses = append(out[len(out)-1].Addresses, kv.Value)
			}
		}
	}
	return out, nil
}

// Device is a block-device view of one LUN.
type Device struct {
	s         *Session
	lun       uint64
	blockSize int
	blocks    uint64
	maxXfer   int
}

// Open logs in to the target of an iSCSI URL and returns its LUN as a
// block device. The URL's credentials override opts.CHAP.
func Open(ctx context.Context, rawURL string, opts Options) (*Device, error) {
	u, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Target == "" || !u.HasLUN {
		return nil, fmt.Errorf("iscsi URL %q: needs /target-iqn/lun", rawURL)
	}
	if c := u.Credentials(); c != nil {
		opts.CHAP = c
	}
	if u.ISER {
		opts.ISER = true
	}
	s, err := Login(ctx, u.Portal, u.Target, opts)
	if err != nil {
		return nil, err
	}
	d := &Device{s: s, lun: u.LUN, maxXfer: 1 << 20}
	if opts.ISER {
		// 512 KiB per command over iSER, as Linux ib_iser does (its
		// default max_sectors is 1024): tgt's iSER target, for one,
		// registers a new buffer for anything larger and runs out of
		// memory (seen in the guest lab).
		d.maxXfer = 512 << 10
	}
	if err := d.probe(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return d, nil
}

// do runs a command, retrying unit attentions (which report events, not
// failures of the command).
func (d *Device) do(ctx context.Context, cdb []byte, out, in []byte) (Result, error) {
	for try := 0; ; try++ {
		r, err := d.s.Do(ctx, d.lun, cdb, out, in)
		var se *SCSIError
		if try < 5 && errors.As(err, &se) && se.Sense != nil && se.Sense.Key == scsi.SenseUnitAttention {
			continue
		}
		return r, err
	}
}

func (d *Device) probe(ctx context.Context) error {
	if _, err := d.do(ctx, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil, nil); err != nil {
		return fmt.Errorf("iscsi: LUN %d: %w", d.lun, err)
	}
	buf := make([]byte, 32)
	cdb := []byte{scsi.OpServiceActionIn16, scsi.SAReadCapacity16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0}
	if _, err := d.do(ctx, cdb, nil, buf); err == nil {
		d.blocks = binary.BigEndian.Uint64(buf) + 1
		d.blockSize = int(binary.BigEndian.Uint32(buf[8:]))
	} else {
		b10 := make([]byte, 8)
		if _, err := d.do(ctx, []byte{scsi.OpReadCapacity10, 0, 0, 0, 0, 0, 0, 0, 0, 0}, nil, b10); err != nil {
			return fmt.Errorf("iscsi: READ CAPACITY: %w", err)
		}
		d.blocks = uint64(binary.BigEndian.Uint32(b10)) + 1
		d.blockSize = int(binary.BigEndian.Uint32(b10[4:]))
	}
	if d.blockSize < 512 || d.blockSize&(d.blockSize-1) != 0 {
		return fmt.Errorf("iscsi: implausible block size %d", d.blockSize)
	}
	return nil
}

// Size returns the capacity in bytes.
func (d *Device) Size() int64 { return int64(d.blocks) * int64(d.blockSize) }

// BlockSize returns the logical block size.
func (d *Device) BlockSize() int { return d.blockSize }

// Session returns the underlying session.
func (d *Device) Session() *Session { return d.s }

func (d *Device) check(n int, off int64) error {
	bs := int64(d.blockSize)
	if off%bs != 0 || int64(n)%bs != 0 {
		return fmt.Errorf("iscsi: I/O of %d bytes at %d is not aligned to %d-byte blocks", n, off, bs)
	}
	if off < 0 || off+int64(n) > d.Size() {
		return fmt.Errorf("iscsi: I/O [%d,%d) beyond the LUN's %d bytes", off, off+int64(n), d.Size())
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
	return d.s.Do(ctx, d.lun, cdb, out, in)
}

// Close logs out.
func (d *Device) Close() error { return d.s.Close() }
