package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/blockwire/blockwire/blockdev"
	"github.com/blockwire/blockwire/datamover/iser"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/nvme/tcphost"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/roce"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/rdma/verbs"
	"github.com/blockwire/blockwire/srp"

	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/iscsi/auth"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/srp/srpinitiator"
)

// Exit codes of the initiator verbs, for scripts.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitUnreachable = 3
	exitLogin       = 4
	exitSCSI        = 5
	exitMismatch    = 6
)

// classify maps an error to an exit code and a message a user can act on.
func classify(err error) (int, string) {
	var le *initiator.LoginError
	var se *initiator.SCSIError
	var rej *srp.LoginRej
	var ne net.Error
	var oe *net.OpError
	switch {
	case errors.As(err, &rej) && rej.Reason == srp.RejectAssociate:
		return exitLogin, err.Error() + " — the target port in the URL (ID_EXT:IOC_GUID) is not this target's (its log prints its srp:// URL), or the target's ACL does not list this initiator port (srp_initiators, or ?initiator= in the URL)"
	case errors.As(err, &le) || errors.Is(err, initiator.ErrTargetAuth) || errors.As(err, &rej):
		return exitLogin, err.Error()
	case errors.As(err, &se):
		if se.Sense != nil && se.Sense.ASC == 0x25 {
			return exitSCSI, "the LUN does not exist on this target: " + err.Error()
		}
		return exitSCSI, err.Error()
	case errors.As(err, &oe) && oe.Op == "dial", errors.As(err, &ne) && ne.Timeout():
		return exitUnreachable, err.Error()
	}
	if strings.Contains(err.Error(), "connect to") {
		return exitUnreachable, err.Error()
	}
	return exitError, err.Error()
}

func fail(stderr io.Writer, err error) int {
	code, msg := classify(err)
	fmt.Fprintf(stderr, "blockwire: %s\n", msg)
	return code
}

// clientOptions are the client verbs' options: the iSCSI initiator's,
// and an NVMe host's DH-HMAC-CHAP secrets (files read at parse time).
type clientOptions struct {
	initiator.Options
	dhchap, dhchapCtrl string // DHHC-1 secrets; "": none
	iscsiCHAP          bool   // iSCSI CHAP flags were given (not only the environment)
}

func clientFlags(name string, stderr io.Writer) (*flag.FlagSet, *clientOptions, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dialer := &fabric.Dialer{}
	// Warnings on stderr; --log-level changes the level, also of what is
	// opened while the flags are read (an RDMA device).
	level := new(slog.LevelVar)
	level.Set(slog.LevelWarn)
	o := &clientOptions{Options: initiator.Options{Dialer: dialer, Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))}}
	fs.Func("log-level", "debug, info, warn (the default) or error, on stderr", func(v string) error {
		return level.UnmarshalText([]byte(v))
	})
	fs.StringVar(&o.InitiatorName, "initiator-name", initiator.DefaultInitiatorName, "initiator name")
	fs.BoolVar(&o.HeaderDigest, "header-digest", false, "ask for CRC32C header digests")
	fs.BoolVar(&o.DataDigest, "data-digest", false, "ask for CRC32C data digests")
	targetSecret := fs.String("target-secret", "", "mutual CHAP: the target's user%secret (or BLOCKWIRE_TARGET_SECRET; off the command line: --target-secret-file)")
	fs.Func("chap-secret-file", "CHAP: read the secret for the URL's user (iscsi://USER@host/...) from this file, not the command line (or BLOCKWIRE_CHAP_SECRET)", func(v string) error {
		b, err := os.ReadFile(v)
		if err != nil {
			return err
		}
		o.CHAP = &authCreds{Secret: strings.TrimRight(string(b), "\r\n")}
		o.iscsiCHAP = true
		return nil
	})
	fs.Func("target-secret-file", "mutual CHAP: read the target's user%secret from this file", func(v string) error {
		b, err := os.ReadFile(v)
		if err != nil {
			return err
		}
		u, p, _ := strings.Cut(strings.TrimRight(string(b), "\r\n"), "%")
		o.TargetCHAP = &authCreds{User: u, Secret: p}
		o.iscsiCHAP = true
		return nil
	})
	secretFile := func(to *string) func(string) error {
		return func(v string) error {
			b, err := os.ReadFile(v)
			if err != nil {
				return err
			}
			*to = strings.TrimSpace(string(b))
			return nil
		}
	}
	fs.Func("dhchap-secret-file", "for nvme+tcp:// URLs: DH-HMAC-CHAP, the host's secret (DHHC-1:...) from this file", secretFile(&o.dhchap))
	fs.Func("dhchap-ctrl-secret-file", "for nvme+tcp:// URLs: bidirectional DH-HMAC-CHAP, the controller's secret (DHHC-1:...) from this file", secretFile(&o.dhchapCtrl))
	fs.Func("iser-profile", "for iser:// URLs: linux (connection first, as Linux ib_iser; default) or rfc5046 (login on TCP, then RDMA)", func(v string) error {
		switch v {
		case "linux":
			dialer.Profile = iser.ProfileLinux
		case "rfc5046":
			dialer.Profile = iser.ProfileRFC5046
		default:
			return fmt.Errorf("want linux or rfc5046, not %q", v)
		}
		return nil
	})
	fs.Func("prefer", "choose the path as the iSER-on-InfiniBand draft does: direct (iSER end nodes, then gateways, then iSCSI/TCP), gateway (gateways first) or any (iSER, then TCP); for iscsi:// and iser:// URLs", func(v string) error {
		switch v {
		case "direct", "gateway", "any":
			o.Prefer = v
			return nil
		}
		return fmt.Errorf("want direct, gateway or any, not %q", v)
	})
	rf := &roceFlag{dialer: dialer, gso: true}
	fs.Var(rf, "roce", "for iser:// URLs: connect over the software RoCEv2 device (InfiniBand RC in UDP) from this local IPv4 or IPv6 address (its RoCEv2 GID), IP or [IP]:UDPPORT (default UDP port 4791)")
	fs.BoolVar(&rf.gso, "roce-gso", true, "with --roce: send runs of packets as UDP GSO datagrams; false: one datagram per packet (packet captures on this host then show packets)")
	dev := &deviceFlag{dialer: dialer, logger: o.Logger}
	fs.BoolVar(&dev.windows, "rdma-windows", false, "with --rdma-device naming a kernel device that has memory windows (rxe, ConnectX): the target reaches each I/O's buffer through a window of its own, invalidated when the I/O ends, instead of the registered memory's one key")
	fs.Var(dev, "rdma-device", "for iser:// and srp:// URLs: the RDMA device to connect over: soft (the default: software iWARP, or RoCEv2 with --roce), auto (the kernel RDMA device when there is exactly one) or a kernel device's name as \"blockwire rdma\" lists it (RDMA/CM, as Linux ib_iser and ib_srp connect)")
	fs.Func("path", "another portal (host:port) of the same target and LUN — another gateway in front of the same shared image — to fail over to when the connection is lost (repeatable)", func(v string) error {
		o.Paths = append(o.Paths, v)
		return nil
	})
	return fs, o, targetSecret
}

// parse parses flags that may come before or after the positional
// arguments ("blockwire write URL --in FILE"), returning the positionals.
// A flag whose value acts on others (afterParse) acts once all are read,
// whatever their order.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	var err error
	fs.Visit(func(f *flag.Flag) {
		if a, ok := f.Value.(afterParser); ok && err == nil {
			if err = a.afterParse(); err != nil {
				err = fmt.Errorf("--%s: %w", f.Name, err)
				fmt.Fprintln(fs.Output(), "blockwire:", err)
			}
		}
	})
	return pos, err
}

// afterParser is a flag's value that acts once every flag is read.
type afterParser interface{ afterParse() error }

// deviceFlag is --rdma-device: the device is opened after the flags are
// read, with --rdma-windows and --log-level as given anywhere on the line.
type deviceFlag struct {
	name    string
	windows bool
	dialer  *fabric.Dialer
	logger  *slog.Logger
}

func (d *deviceFlag) String() string {
	if d == nil {
		return ""
	}
	return d.name
}

func (d *deviceFlag) Set(v string) error { d.name = v; return nil }

func (d *deviceFlag) afterParse() error {
	if d.name == "soft" || d.name == "" {
		return nil
	}
	dev, err := verbs.Open(d.name, verbs.Options{Remote: true, Windows: d.windows, Logger: d.logger})
	if err != nil {
		return err
	}
	d.dialer.RDMA = dev // lives as long as the command
	return nil
}

// roceFlag is --roce: the software RoCEv2 device is opened after the
// flags are read, with --roce-gso as given anywhere on the line.
type roceFlag struct {
	ip     string
	port   int // 0: RoCEv2's 4791
	gso    bool
	dialer *fabric.Dialer
}

func (r *roceFlag) String() string {
	if r == nil || r.ip == "" {
		return ""
	}
	return net.JoinHostPort(r.ip, strconv.Itoa(r.port))
}

func (r *roceFlag) Set(v string) error {
	r.ip, r.port = v, 0
	if h, p, err := net.SplitHostPort(v); err == nil {
		port, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("UDP port %q", p)
		}
		r.ip, r.port = h, port
	}
	return nil
}

func (r *roceFlag) afterParse() error {
	d, err := roce.Open(r.ip, roce.Options{Port: r.port, NoGSO: !r.gso})
	if err != nil {
		return err
	}
	r.dialer.RDMA = d // lives as long as the command
	return nil
}

// parseOffset parses --offset, where 0 is allowed (ParseSize wants a
// positive size).
func parseOffset(v string, stderr io.Writer) (int64, bool) {
	if v == "0" {
		return 0, true
	}
	n, err := config.ParseSize(v)
	if err != nil {
		fmt.Fprintln(stderr, "blockwire: --offset:", err)
		return 0, false
	}
	return n, true
}

func finishOptions(o *clientOptions, targetSecret string, stderr io.Writer) {
	if targetSecret != "" {
		o.iscsiCHAP = true
	}
	if targetSecret == "" {
		targetSecret = os.Getenv("BLOCKWIRE_TARGET_SECRET")
	}
	if targetSecret != "" {
		u, p, _ := strings.Cut(targetSecret, "%")
		o.TargetCHAP = &authCreds{User: u, Secret: p}
	}
	if o.CHAP == nil {
		if v := os.Getenv("BLOCKWIRE_CHAP_SECRET"); v != "" {
			o.CHAP = &authCreds{Secret: v} // for a URL that names only the user
		}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

func discover(args []string, stdout, stderr io.Writer) int {
	fs, o, ts := clientFlags("discover", stderr)
	asJSON := fs.Bool("json", false, "print the targets as JSON (docs/json.md)")
	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil || len(pos) != 1 {
		fmt.Fprintln(stderr, "usage: blockwire discover [flags] PORTAL   (host[:port] or iscsi://host[:port])")
		return exitUsage
	}
	finishOptions(o, *ts, stderr)
	portal := pos[0]
	if isNVMeURL(portal) {
		return discoverNVMe(portal, *o, *asJSON, stdout, stderr)
	}
	if isURL(portal) {
		u, err := initiator.ParseURL(portal)
		if err != nil {
			fmt.Fprintln(stderr, "blockwire:", err)
			return exitUsage
		}
		portal = u.Portal
		if c := u.Credentials(); c != nil {
			if c.Secret == "" && o.CHAP != nil {
				c.Secret = o.CHAP.Secret // from --chap-secret-file or BLOCKWIRE_CHAP_SECRET
			}
			o.CHAP = c
		} else {
			o.CHAP = nil
		}
		o.ISER = u.ISER
	}
	ctx, cancel := signalContext()
	defer cancel()
	found, err := initiator.Discover(ctx, portal, o.Options)
	if err != nil {
		return fail(stderr, err)
	}
	if *asJSON {
		out := []discovered{}
		for _, t := range found {
			out = append(out, discovered{Name: t.Name, Addresses: append([]string{}, t.Addresses...)})
		}
		writeJSON(stdout, out)
		return exitOK
	}
	for _, t := range found {
		for _, a := range t.Addresses {
			fmt.Fprintf(stdout, "%s %s\n", a, t.Name)
		}
		if len(t.Addresses) == 0 {
			fmt.Fprintf(stdout, "- %s\n", t.Name)
		}
	}
	return exitOK
}

// device is a LUN reached through one of the initiators: iSCSI or iSER
// (package iscsi/initiator) or SRP (package srp/srpinitiator).
type device interface {
	ReadAtContext(ctx context.Context, p []byte, off int64) (int, error)
	WriteAtContext(ctx context.Context, p []byte, off int64) (int, error)
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Do(ctx context.Context, cdb []byte, out, in []byte) (blockdev.Result, error)
	Size() int64
	BlockSize() int
	Flush() error
	Close() error
}

// checkURL reports a malformed iscsi://, iser:// or srp:// URL.
func checkURL(u string) error {
	if isNVMeURL(u) {
		pu, err := tcphost.ParseURL(u)
		if err == nil && (pu.SubNQN == "" || pu.NSID == 0) {
			err = fmt.Errorf("URL %q names no namespace: write nvme+tcp://HOST[:PORT]/SUBSYSTEM-NQN/NSID (blockwire discover nvme+tcp://HOST lists the subsystems)", u)
		}
		return err
	}
	if strings.HasPrefix(u, "srp://") {
		_, err := srpinitiator.ParseURL(u)
		return err
	}
	pu, err := initiator.ParseURL(u)
	if err == nil && (pu.Target == "" || !pu.HasLUN) {
		err = fmt.Errorf("URL %q names no LUN: write iscsi://HOST[:PORT]/TARGET-IQN/LUN (blockwire discover HOST lists the targets)", u)
	}
	return err
}

// openDevice logs in to the LUN of an iscsi://, iser:// or srp:// URL.
func openDevice(ctx context.Context, u string, o clientOptions) (device, error) {
	return retrySetup(ctx, o.Logger, setupRetries, func() (device, error) { return openOnce(ctx, u, o) })
}

// setupRetries is how often a connection whose set-up failed below the
// target (rdma.ErrSetupFailed) is tried again, after 250 ms, 500 ms, then
// 1 s: as open-iscsi retries an initial login and ib_srp's daemon
// reconnects. LIO's ib_srpt over the kernel's siw now and then cuts the
// MPA exchange of a new connection for a second after another one ended.
const setupRetries = 3

// retrySetup runs open, again after a failed set-up (rdma.ErrSetupFailed)
// up to retries times. Anything else — a login answered, a reject, a
// refused or unreachable address — is the answer, returned at once.
func retrySetup(ctx context.Context, log *slog.Logger, retries int, open func() (device, error)) (device, error) {
	wait := 250 * time.Millisecond
	for try := 1; ; try++ {
		d, err := open()
		if err == nil || try > retries || !errors.Is(err, rdma.ErrSetupFailed) {
			return d, err
		}
		log.Info("connection set-up failed; trying again", "err", err, "in", wait, "try", try+1)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, err
		}
		wait *= 2
	}
}

// openOnce is one attempt of openDevice.
func openOnce(ctx context.Context, u string, o clientOptions) (device, error) {
	if isNVMeURL(u) {
		ho, err := nvmeOptions(o)
		if err != nil {
			return nil, err
		}
		d, err := tcphost.Open(ctx, u, ho)
		if err != nil {
			return nil, err
		}
		return nvmeDevice{d}, nil
	}
	if strings.HasPrefix(u, "srp://") {
		var f rdma.Fabric = siw.New(siw.Options{Logger: o.Logger})
		if d, ok := o.Dialer.(*fabric.Dialer); ok && d.RDMA != nil {
			f = d.RDMA // --rdma-device or --roce
		}
		return srpinitiator.Open(ctx, u, srpinitiator.Options{Fabric: f, Logger: o.Logger})
	}
	return initiator.Open(ctx, u, o.Options)
}

func openURL(ctx context.Context, url string, o *clientOptions, ts string, stderr io.Writer) (device, int) {
	finishOptions(o, ts, stderr)
	if err := checkURL(url); err != nil {
		fmt.Fprintln(stderr, "blockwire:", err)
		return nil, exitUsage
	}
	d, err := openDevice(ctx, url, *o)
	if err != nil {
		return nil, fail(stderr, err)
	}
	return d, exitOK
}

func inquiry(args []string, stdout, stderr io.Writer) int {
	fs, o, ts := clientFlags("inquiry", stderr)
	asJSON := fs.Bool("json", false, "print the answer as JSON (docs/json.md)")
	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil || len(pos) != 1 {
		io.WriteString(stderr, "usage: blockwire inquiry [flags] iscsi://[user[%password]@]host[:port]/iqn/lun\n")
		return exitUsage
	}
	ctx, cancel := signalContext()
	defer cancel()
	d, code := openURL(ctx, pos[0], o, *ts, stderr)
	if d == nil {
		return code
	}
	defer d.Close()
	buf := make([]byte, 96)
	r, err := d.Do(ctx, []byte{scsi.OpInquiry, 0, 0, 0, 96, 0}, nil, buf)
	if err != nil {
		return fail(stderr, err)
	}
	buf = buf[:r.In]
	if len(buf) < 36 {
		fmt.Fprintf(stderr, "blockwire: INQUIRY returned %d bytes\n", len(buf))
		return exitSCSI
	}
	serialNo := ""
	sbuf := make([]byte, 255)
	if r, err := d.Do(ctx, []byte{scsi.OpInquiry, 1, 0x80, 0, 255, 0}, nil, sbuf); err == nil && r.In > 4 {
		serialNo = strings.TrimSpace(string(sbuf[4:r.In]))
	}
	in := inquired{Vendor: strings.TrimSpace(string(buf[8:16])), Product: strings.TrimSpace(string(buf[16:32])),
		Revision: strings.TrimSpace(string(buf[32:36])), DeviceType: int(buf[0] & 0x1f), Serial: serialNo,
		BlockSize: d.BlockSize(), CapacityBytes: d.Size(), CapacityBlocks: d.Size() / int64(d.BlockSize())}
	if *asJSON {
		writeJSON(stdout, in)
		return exitOK
	}
	fmt.Fprintf(stdout, "vendor: %s\nproduct: %s\nrevision: %s\ndevice type: %#02x\nserial: %s\nblock size: %d\ncapacity: %d bytes (%d blocks)\n",
		in.Vendor, in.Product, in.Revision, in.DeviceType, in.Serial, in.BlockSize, in.CapacityBytes, in.CapacityBlocks)
	return exitOK
}

func readVerb(args []string, stdout, stderr io.Writer) int {
	fs, o, ts := clientFlags("read", stderr)
	off := fs.String("offset", "0", "byte offset (block aligned)")
	length := fs.String("length", "", "bytes to read (default: to the end)")
	out := fs.String("out", "-", "output file (- for standard output)")
	force := fs.Bool("force", false, "let --out replace an existing file that holds data")
	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil || len(pos) != 1 {
		fmt.Fprintln(stderr, "usage: blockwire read [flags] URL [--offset N] [--length N] [--out FILE]")
		return exitUsage
	}
	// Usage errors are reported before logging in.
	start, ok := parseOffset(*off, stderr)
	if !ok {
		return exitUsage
	}
	if *out != "-" && !*force {
		if err := refuseClobber(*out); err != nil {
			fmt.Fprintln(stderr, "blockwire:", err)
			return exitUsage
		}
	}
	ctx, cancel := signalContext()
	defer cancel()
	d, code := openURL(ctx, pos[0], o, *ts, stderr)
	if d == nil {
		return code
	}
	defer d.Close()
	n := d.Size() - start
	if *length != "" {
		if n, err = config.ParseSize(*length); err != nil {
			fmt.Fprintln(stderr, "blockwire: --length:", err)
			return exitUsage
		}
	}
	w := stdout
	if *out != "-" {
		f, err := os.Create(*out)
		if err != nil {
			fmt.Fprintln(stderr, "blockwire:", err)
			return exitError
		}
		defer f.Close()
		w = f
	}
	buf := make([]byte, 1<<20)
	for at := start; at < start+n; {
		c := int(min(int64(len(buf)), start+n-at))
		if _, err := d.ReadAtContext(ctx, buf[:c], at); err != nil {
			return fail(stderr, err)
		}
		if _, err := w.Write(buf[:c]); err != nil {
			fmt.Fprintln(stderr, "blockwire:", err)
			return exitError
		}
		at += int64(c)
	}
	return exitOK
}

func writeVerb(args []string, stdout, stderr io.Writer) int {
	fs, o, ts := clientFlags("write", stderr)
	off := fs.String("offset", "0", "byte offset (block aligned)")
	in := fs.String("in", "-", "input file (- for standard input); its size a multiple of the block size")
	pad := fs.Bool("pad", false, "fill a short last block with zeroes (as dd conv=sync) instead of refusing")
	overwrite := fs.Bool("overwrite", false, "let it write over the LUN's data (required: writing replaces what the LUN holds there)")
	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil || len(pos) != 1 {
		fmt.Fprintln(stderr, "usage: blockwire write [flags] URL --in FILE [--offset N] --overwrite")
		return exitUsage
	}
	// Usage errors are reported before logging in.
	start, ok := parseOffset(*off, stderr)
	if !ok {
		return exitUsage
	}
	if !*overwrite {
		fmt.Fprintf(stderr, "blockwire: write replaces what the LUN holds from offset %d on: add --overwrite if that is what you want\n", start)
		return exitUsage
	}
	inSize := int64(-1) // a regular file's size, checked against the block size and the LUN's
	if *in != "-" {
		if st, err := os.Stat(*in); err == nil && st.Mode().IsRegular() {
			inSize = st.Size()
		}
		if !*pad && inSize%512 != 0 && inSize > 0 {
			fmt.Fprintf(stderr, "blockwire: %s is %d bytes, not a multiple of the block size (512 or 4096): pad it, or pass --pad to fill the last block with zeroes\n", *in, inSize)
			return exitUsage
		}
	}
	ctx, cancel := signalContext()
	defer cancel()
	d, code := openURL(ctx, pos[0], o, *ts, stderr)
	if d == nil {
		return code
	}
	defer d.Close()
	bs := d.BlockSize()
	if !*pad && inSize > 0 && inSize%int64(bs) != 0 {
		fmt.Fprintf(stderr, "blockwire: %s is %d bytes, not a multiple of the LUN's %d-byte block: pad it, or pass --pad to fill the last block with zeroes\n", *in, inSize, bs)
		return exitUsage
	}
	// The whole input must fit before a byte is written: a write that
	// fails half-way leaves the LUN half-overwritten.
	if need := (inSize + int64(bs) - 1) / int64(bs) * int64(bs); inSize > 0 && start+need > d.Size() {
		fmt.Fprintf(stderr, "blockwire: %s (%d bytes) does not fit in the LUN at offset %d (%d bytes, %d from there): nothing written\n", *in, inSize, start, d.Size(), max(d.Size()-start, 0))
		return exitUsage
	}
	var r io.Reader = os.Stdin
	if *in != "-" {
		f, err := os.Open(*in)
		if err != nil {
			fmt.Fprintln(stderr, "blockwire:", err)
			return exitError
		}
		defer f.Close()
		r = f
	}
	buf := make([]byte, 1<<20)
	at := start
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if n%bs != 0 {
				if !*pad {
					fmt.Fprintf(stderr, "blockwire: the input ends %d bytes into a %d-byte block (%d bytes written): pass --pad to fill the last block with zeroes\n", n%bs, bs, at-start)
					return exitUsage
				}
				// Pad a short last block with zeroes, as dd conv=sync does.
				pad := bs - n%bs
				clear(buf[n : n+pad])
				n += pad
			}
			if at+int64(n) > d.Size() { // standard input: its size was not known
				fmt.Fprintf(stderr, "blockwire: the input does not fit in the LUN (%d bytes) at offset %d: it runs past the end after %d bytes written\n", d.Size(), start, at-start)
				return exitUsage
			}
			if _, werr := d.WriteAtContext(ctx, buf[:n], at); werr != nil {
				return fail(stderr, werr)
			}
			at += int64(n)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			fmt.Fprintln(stderr, "blockwire:", err)
			return exitError
		}
	}
	if err := d.Flush(); err != nil {
		return fail(stderr, err)
	}
	fmt.Fprintf(stderr, "wrote %d bytes at offset %d\n", at-start, start)
	return exitOK
}

// bench is a small fio: fixed block size, queue depth, duration, with
// optional verification of every byte read.
func bench(args []string, stdout, stderr io.Writer) int {
	fs, o, ts := clientFlags("bench", stderr)
	rw := fs.String("rw", "randread", "read, write, randread or randwrite")
	bsFlag := fs.String("bs", "4k", "block size")
	qd := fs.Int("qd", 32, "queue depth (concurrent commands)")
	dur := fs.Duration("time", 10*time.Second, "run time")
	region := fs.String("size", "256MiB", "size of the region used, from offset 0 (capped at the LUN size)")
	verify := fs.Bool("verify", false, "check data: reads see a known pattern, writes are read back and compared")
	overwrite := fs.Bool("overwrite", false, "let a write workload, or --verify on a read workload (which first writes its pattern), write over the region (destroying the data there)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the run (go tool pprof) to this file")
	asJSON := fs.Bool("json", false, "print the result as JSON (docs/json.md)")
	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil || len(pos) != 1 {
		fmt.Fprintln(stderr, "usage: blockwire bench [flags] URL")
		return exitUsage
	}
	if *cpuprofile != "" {
		stop, err := startProfile(*cpuprofile)
		if err != nil {
			fmt.Fprintf(stderr, "blockwire: %v\n", err)
			return 1
		}
		defer stop()
	}
	j := benchJob{rw: *rw, random: strings.HasPrefix(*rw, "rand"), write: strings.HasSuffix(*rw, "write"), verify: *verify, qd: *qd, dur: *dur}
	if *rw != "read" && *rw != "write" && *rw != "randread" && *rw != "randwrite" {
		fmt.Fprintln(stderr, "blockwire: --rw must be read, write, randread or randwrite")
		return exitUsage
	}
	bs64, err := config.ParseSize(*bsFlag)
	if err != nil || *qd < 1 {
		fmt.Fprintln(stderr, "blockwire: bad --bs or --qd")
		return exitUsage
	}
	if *dur <= 0 {
		fmt.Fprintf(stderr, "blockwire: --time %v: give a positive duration, such as 10s or 1m\n", *dur)
		return exitUsage
	}
	if j.write && !*overwrite {
		fmt.Fprintf(stderr, "blockwire: a %s workload writes over the region it uses (--size, %s from offset 0), destroying the data there: add --overwrite if that is what you want\n", *rw, *region)
		return exitUsage
	}
	if j.verify && !j.write && !*overwrite {
		fmt.Fprintf(stderr, "blockwire: --verify on a %s workload first writes its pattern over the region it reads (--size, %s from offset 0), destroying the data there: add --overwrite if that is what you want\n", *rw, *region)
		return exitUsage
	}
	regionSize, err := config.ParseSize(*region)
	if err != nil {
		fmt.Fprintln(stderr, "blockwire: --size:", err)
		return exitUsage
	}
	ctx, cancel := signalContext()
	defer cancel()
	d, code := openURL(ctx, pos[0], o, *ts, stderr)
	if d == nil {
		return code
	}
	defer d.Close()
	j.bs = int(bs64)
	if j.bs%d.BlockSize() != 0 {
		fmt.Fprintf(stderr, "blockwire: --bs %d is not a multiple of the %d-byte block\n", j.bs, d.BlockSize())
		return exitUsage
	}
	j.slots = min(regionSize, d.Size()) / int64(j.bs)
	if j.slots < int64(j.qd) {
		fmt.Fprintln(stderr, "blockwire: region too small for the queue depth")
		return exitUsage
	}
	if j.verify && !j.write {
		fmt.Fprintf(stderr, "filling %d MiB with the verification pattern\n", j.slots*int64(j.bs)>>20)
		buf := make([]byte, j.bs)
		for s := range j.slots {
			benchPattern(buf, s, 0)
			if _, err := d.WriteAtContext(ctx, buf, s*int64(j.bs)); err != nil {
				return fail(stderr, err)
			}
		}
	}
	r, err := j.run(ctx, d)
	if err != nil {
		return fail(stderr, err)
	}
	if *asJSON && r.ios > 0 {
		return j.printJSON(r, stdout)
	}
	return j.print(r, stdout, stderr)
}

// benchJob is one bench workload: its I/Os (block size, sequential or
// random, reads or writes), queue depth, duration, and the region of
// slots (blocks of the block size) it uses.
type benchJob struct {
	rw                    string
	random, write, verify bool
	bs, qd                int
	dur                   time.Duration
	slots                 int64
}

// benchRun is what a run measured.
type benchRun struct {
	elapsed         time.Duration
	ios, mismatches int64
	lat             []time.Duration // every I/O's, sorted
	perSecond       []int64         // I/Os completed in each second (the last may be short)
}

// benchPattern fills buf with the verification pattern of a slot's
// generation gen: what a verified read expects, or a verified write puts.
func benchPattern(buf []byte, slot int64, gen uint64) {
	for i := 0; i+16 <= len(buf); i += 16 {
		binary.LittleEndian.PutUint64(buf[i:], uint64(slot)<<20|uint64(i))
		binary.LittleEndian.PutUint64(buf[i+8:], gen)
	}
}

// run keeps qd I/Os in flight on d for the job's duration, one worker
// each; each worker owns every qd-th slot, so verification never races.
func (j *benchJob) run(ctx context.Context, d device) (benchRun, error) {
	var mismatches, ios atomic.Int64
	var firstErr atomic.Value
	lat := make([][]time.Duration, j.qd)
	perSecond := make([]atomic.Int64, int(j.dur/time.Second)+2)
	start := time.Now()
	deadline := start.Add(j.dur)
	var wg sync.WaitGroup
	for w := range j.qd {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(w), 7))
			buf, check := make([]byte, j.bs), make([]byte, j.bs)
			rand.Read(buf)
			mine := (j.slots - int64(w) + int64(j.qd) - 1) / int64(j.qd)
			gens := map[int64]uint64{}
			for i := int64(0); time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				k := i % mine
				if j.random {
					k = rng.Int64N(mine)
				}
				slot := k*int64(j.qd) + int64(w)
				off := slot * int64(j.bs)
				t0 := time.Now()
				var err error
				if j.write {
					if j.verify {
						gens[slot]++
						benchPattern(buf, slot, gens[slot])
					}
					_, err = d.WriteAtContext(ctx, buf, off)
				} else {
					_, err = d.ReadAtContext(ctx, buf, off)
				}
				lat[w] = append(lat[w], time.Since(t0))
				if err != nil {
					if ctx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
					}
					return
				}
				ios.Add(1)
				perSecond[min(int(time.Since(start)/time.Second), len(perSecond)-1)].Add(1)
				if !j.verify {
					continue
				}
				// check: what was written, read back; or what a read
				// should have found.
				if j.write {
					if _, err := d.ReadAtContext(ctx, check, off); err != nil {
						firstErr.CompareAndSwap(nil, err)
						return
					}
				} else {
					benchPattern(check, slot, 0)
				}
				if !bytes.Equal(buf, check) {
					mismatches.Add(1)
				}
			}
		})
	}
	wg.Wait()
	r := benchRun{elapsed: time.Since(start), ios: ios.Load(), mismatches: mismatches.Load()}
	if v := firstErr.Load(); v != nil {
		return r, v.(error)
	}
	for _, l := range lat {
		r.lat = append(r.lat, l...)
	}
	slices.Sort(r.lat)
	for i := range perSecond {
		if float64(i) >= r.elapsed.Seconds() {
			break
		}
		r.perSecond = append(r.perSecond, perSecond[i].Load())
	}
	return r, nil
}

// pct is the p-th percentile latency in microseconds (0 with none).
func (r *benchRun) pct(p float64) float64 {
	if len(r.lat) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(r.lat)))) - 1
	return float64(r.lat[max(i, 0)].Microseconds())
}

func (r *benchRun) iops() float64 { return float64(r.ios) / r.elapsed.Seconds() }

// printJSON prints the run as docs/json.md says.
func (j *benchJob) printJSON(r benchRun, stdout io.Writer) int {
	iops := r.iops()
	out := benchResult{RW: j.rw, BlockSize: j.bs, QueueDepth: j.qd, Seconds: r.elapsed.Seconds(), IOs: r.ios, IOPS: iops,
		MiBPerSec: iops * float64(j.bs) / (1 << 20), IOsBySecond: r.perSecond}
	out.LatencyUS.P50, out.LatencyUS.P99, out.LatencyUS.P999, out.LatencyUS.Max = r.pct(50), r.pct(99), r.pct(99.9), r.pct(100)
	for _, p := range latencyPercentiles() {
		out.LatencyDistribution = append(out.LatencyDistribution, latencyPoint{p, r.pct(p)})
	}
	if j.verify {
		out.Mismatches = &r.mismatches
	}
	writeJSON(stdout, out)
	if j.verify && r.mismatches > 0 {
		return exitMismatch
	}
	return exitOK
}

// print prints the run as fio would.
func (j *benchJob) print(r benchRun, stdout, stderr io.Writer) int {
	iops := r.iops()
	fmt.Fprintf(stdout, "%s: bs=%d qd=%d time=%.1fs ios=%d\n", j.rw, j.bs, j.qd, r.elapsed.Seconds(), r.ios)
	fmt.Fprintf(stdout, "  IOPS=%.0f, BW=%.1fMiB/s (%.1fMB/s)\n", iops, iops*float64(j.bs)/(1<<20), iops*float64(j.bs)/1e6)
	fmt.Fprintf(stdout, "  lat (usec): p50=%.0f, p99=%.0f, p99.9=%.0f, max=%.0f\n", r.pct(50), r.pct(99), r.pct(99.9), r.pct(100))
	if r.ios == 0 {
		// Nothing completed (a stalled target, an interrupted run): no
		// figure, and nothing verified.
		fmt.Fprintf(stderr, "blockwire: no I/O completed in %.1fs\n", r.elapsed.Seconds())
		return exitError
	}
	if j.verify {
		fmt.Fprintf(stdout, "  verify: %d mismatches\n", r.mismatches)
		if r.mismatches > 0 {
			return exitMismatch
		}
	}
	return exitOK
}

type authCreds = auth.Credentials
