package tcphost

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// DefaultPort is NVMe/TCP's port.
const DefaultPort = 4420

// URL is a namespace's address: nvme+tcp://HOST[:PORT]/SUBNQN/NSID.
type URL struct {
	Addr   string // host:port
	SubNQN string
	NSID   uint32 // 0: none named (discovery)
}

// ParseURL reads an nvme+tcp:// URL; the NSID may be left out (for
// discovery), the port (4420).
func ParseURL(s string) (URL, error) {
	rest, ok := strings.CutPrefix(s, "nvme+tcp://")
	if !ok {
		return URL{}, fmt.Errorf("%q is not an nvme+tcp:// URL", s)
	}
	host, path, _ := strings.Cut(rest, "/")
	if host == "" {
		return URL{}, fmt.Errorf("URL %q names no host", s)
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		h := host
		if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
			h = h[1 : len(h)-1]
		}
		host = net.JoinHostPort(h, strconv.Itoa(DefaultPort))
	}
	name, port, err := net.SplitHostPort(host)
	if p, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil || p == 0 || name == "" || strings.ContainsAny(name, "[]") {
		return URL{}, fmt.Errorf("URL %q: %q is not HOST[:PORT]", s, host)
	}
	u := URL{Addr: host}
	nqn, ns, _ := strings.Cut(path, "/")
	u.SubNQN = nqn
	if ns != "" {
		n, err := strconv.ParseUint(ns, 10, 32)
		if err != nil || n == 0 || n == 0xffffffff {
			return URL{}, fmt.Errorf("URL %q: namespace ID %q is not 1 to 4294967294", s, ns)
		}
		u.NSID = uint32(n)
	}
	return u, nil
}

// Device is one namespace of a controller as a block device: reads and
// writes at byte offsets in whole blocks, split at the controller's
// largest transfer.
type Device struct {
	c   *Controller
	ns  Namespace
	max int // bytes per command
	ctx context.Context
}

// Open connects to the namespace a URL names.
func Open(ctx context.Context, url string, o Options) (*Device, error) {
	u, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	if u.SubNQN == "" || u.NSID == 0 {
		return nil, fmt.Errorf("URL %q names no namespace: write nvme+tcp://HOST[:PORT]/SUBNQN/NSID (blockwire discover nvme+tcp://HOST lists the subsystems)", url)
	}
	c, err := Connect(ctx, u.Addr, u.SubNQN, o)
	if err != nil {
		return nil, err
	}
	ns, err := c.Namespace(ctx, u.NSID)
	if err != nil {
		c.Close()
		return nil, err
	}
	max := 1 << 20
	if mdts := c.ident[77]; mdts != 0 && 4096<<mdts < max {
		max = 4096 << mdts
	}
	return &Device{c: c, ns: ns, max: max / ns.BlockSize * ns.BlockSize, ctx: context.Background()}, nil
}

// Controller is the device's controller.
func (d *Device) Controller() *Controller { return d.c }

// Namespace is what Identify said of the namespace.
func (d *Device) Namespace() Namespace { return d.ns }

func (d *Device) Size() int64    { return int64(d.ns.Blocks) * int64(d.ns.BlockSize) }
func (d *Device) BlockSize() int { return d.ns.BlockSize }

// Thin reports whether the namespace deallocates (NSFEAT thin
// provisioning), which makes Unmap worth sending.
func (d *Device) Thin() bool { return d.ns.Thin }

// ErrUnaligned: an offset or length that is not whole blocks.
var ErrUnaligned = errors.New("tcphost: I/O not in whole blocks")

func (d *Device) check(n int, off int64) error {
	bs := int64(d.ns.BlockSize)
	if off%bs != 0 || int64(n)%bs != 0 {
		return ErrUnaligned
	}
	if off < 0 || off+int64(n) > d.Size() {
		return fmt.Errorf("tcphost: %d bytes at %d beyond the namespace's %d", n, off, d.Size())
	}
	return nil
}

// ReadAtContext reads len(p) bytes at off.
func (d *Device) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return d.each(p, off, func(lba uint64, q []byte) error { return d.c.Read(ctx, d.ns.ID, d.ns.BlockSize, lba, q) })
}

// WriteAtContext writes p at off.
func (d *Device) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	return d.each(p, off, func(lba uint64, q []byte) error { return d.c.Write(ctx, d.ns.ID, d.ns.BlockSize, lba, q, false) })
}

// each runs do on p at off in commands of at most the largest transfer,
// one after the other; it returns the bytes done before a failure.
func (d *Device) each(p []byte, off int64, do func(lba uint64, q []byte) error) (int, error) {
	if err := d.check(len(p), off); err != nil {
		return 0, err
	}
	done := 0
	for done < len(p) {
		n := min(len(p)-done, d.max)
		if err := do(uint64(off+int64(done))/uint64(d.ns.BlockSize), p[done:done+n]); err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

func (d *Device) ReadAt(p []byte, off int64) (int, error)  { return d.ReadAtContext(d.ctx, p, off) }
func (d *Device) WriteAt(p []byte, off int64) (int, error) { return d.WriteAtContext(d.ctx, p, off) }

// Flush flushes the namespace.
func (d *Device) Flush() error { return d.c.Flush(d.ctx, d.ns.ID) }

// Unmap deallocates length bytes at off (whole blocks).
func (d *Device) Unmap(off, length int64) error {
	if err := d.check(0, off); err != nil || length%int64(d.ns.BlockSize) != 0 {
		return ErrUnaligned
	}
	bs := int64(d.ns.BlockSize)
	for length > 0 {
		n := min(length/bs, 1<<31)
		if err := d.c.Deallocate(d.ctx, d.ns.ID, uint64(off/bs), uint32(n)); err != nil {
			return err
		}
		off += n * bs
		length -= n * bs
	}
	return nil
}

// Close disconnects.
func (d *Device) Close() error { return d.c.Close() }

// Model and Serial are the controller's, from Identify Controller.
func (c *Controller) Model() string  { return strings.TrimRight(string(c.ident[24:64]), " \x00") }
func (c *Controller) Serial() string { return strings.TrimRight(string(c.ident[4:24]), " \x00") }

// SubNQN is the subsystem's NQN as the controller reports it.
func (c *Controller) SubNQN() string {
	return strings.TrimRight(string(c.ident[768:1024]), "\x00")
}
