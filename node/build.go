package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/backend/file"
	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/backend/remote"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/auth"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/iscsi/iscsitarget"
	"github.com/blockwire/blockwire/nvme/tcphost"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/scsi"
	"github.com/blockwire/blockwire/scsitarget"
	"github.com/blockwire/blockwire/srp/srpinitiator"
)

// buildLU makes the logical unit a configuration's LUN describes, on the
// storage open gives (Options.Backend; nil, or a nil result: the built-in
// backends). A file LUN's ring polls up to poll (serve --poll).
func buildLU(targetName string, lc config.LUN, open BackendOpener, poll time.Duration, log *slog.Logger) (*scsitarget.LU, error) {
	var size int64
	if lc.Size != "" {
		var err error
		if size, err = config.ParseSize(lc.Size); err != nil {
			return nil, err
		}
	}
	var be backend.Backend
	var err error
	blockSize := lc.BlockSize
	if open != nil {
		if be, err = open(targetName, lc); err != nil {
			return nil, fmt.Errorf("%s LUN %d: %w", targetName, lc.ID, err)
		}
	}
	switch {
	case be != nil:
		// The embedding program's storage.
	case lc.Remote != "":
		// A gateway LUN: another target's LUN through our
		// initiator, which reconnects for up to 30 s before commands fail
		// with a retryable sense.
		var d remote.Device
		if d, err = openRemote(context.Background(), lc.Remote, log.With("remote", config.RedactURL(lc.Remote))); err == nil {
			if blockSize != 0 && blockSize != d.BlockSize() {
				d.Close()
				err = fmt.Errorf("%s: block_size %d, but the remote LUN's is %d", config.RedactURL(lc.Remote), blockSize, d.BlockSize())
			} else {
				blockSize = d.BlockSize()
				be = remote.New(d, config.RedactURL(lc.Remote))
			}
		}
	case lc.RBD != "":
		// Ceph RBD: needs a build with the rbd tag (rbd.go).
		be, err = openRBD(lc, log)
	case lc.File != "":
		var f *file.File
		f, err = file.Open(lc.File, file.Options{Size: size, Grow: lc.Grow, ReadOnly: lc.ReadOnly,
			Engine: lc.IOEngine, Direct: lc.Direct, BlockSize: blockSize, Poll: poll})
		if err == nil {
			engine, why := f.Engine()
			if err := f.RingRefused(); err != nil {
				log.Warn("file LUN on pread/pwrite: the kernel refuses io_uring", "target", targetName, "lun", lc.ID, "file", lc.File, "err", err)
			}
			log.Info("file LUN", "target", targetName, "lun", lc.ID, "file", lc.File, "io_engine", engine, "direct", f.Direct(), "poll", f.Poll(), "why", why)
			be = f
		}
	default:
		be, err = mem.New(size)
	}
	if err != nil {
		return nil, err
	}
	prFile := ""
	if lc.File != "" {
		prFile = lc.File + ".pr" // persistent reservations with APTPL live beside the data
	}
	lu, err := scsitarget.NewLU(targetName, scsitarget.LUConfig{LUN: lc.ID, Backend: be, BlockSize: blockSize, ReadOnly: lc.ReadOnly,
		Removable: lc.Removable, Serial: lc.Serial, PRFile: prFile, Logger: log.With("lun", lc.ID),
		WriteThrough: lc.WriteCache != nil && !*lc.WriteCache})
	if err != nil {
		if c, ok := be.(backend.Closer); ok {
			c.Close()
		}
		return nil, err
	}
	return lu, nil
}

// buildTarget makes a target's device with its LUNs and its iSCSI
// description (reachable on portals: nil for every one).
func buildTarget(tc config.Target, portals []string, open BackendOpener, poll time.Duration, log *slog.Logger) (*scsitarget.Device, *iscsitarget.Target, error) {
	t, err := targetAccess(tc, portals)
	if err != nil {
		return nil, nil, err
	}
	dev := scsitarget.NewDevice(tc.Name, log.With("target", tc.Name))
	for _, lc := range tc.LUNs {
		lu, err := buildLU(tc.Name, lc, open, poll, log)
		if err == nil {
			if err = dev.AddLU(lu); err != nil {
				lu.Close()
			}
		}
		if err != nil {
			dev.Close()
			return nil, nil, err
		}
	}
	if len(tc.PortGroups) > 0 {
		var groups []scsi.PortGroup
		for _, g := range tc.PortGroups {
			pg, err := scsi.ParsePortGroup(g)
			if err != nil {
				dev.Close()
				return nil, nil, err
			}
			groups = append(groups, pg)
		}
		if err := dev.SetPortGroups(groups); err != nil {
			dev.Close()
			return nil, nil, err
		}
	}
	t.Device = dev
	return dev, t, nil
}

// setDiscovery applies the discovery sessions' access rules.
func setDiscovery(srv *iscsitarget.Server, d *config.Discovery) error {
	if d == nil {
		return srv.SetDiscovery(nil)
	}
	t, err := targetAccess(d.AsTarget(), nil)
	if err == nil {
		err = srv.SetDiscovery(t)
	}
	return err
}

// targetAccess is a target's name, alias, ACL and CHAP credentials, and
// the iSCSI portals it is reachable on, without its device.
func targetAccess(tc config.Target, portals []string) (*iscsitarget.Target, error) {
	allowed := tc.AllowedInitiators()
	t := &iscsitarget.Target{Name: tc.Name, Alias: tc.Alias, Initiators: allowed, Restricted: allowed != nil, TPGT: tc.TPGT,
		Redirect: tc.Redirect, RedirectPermanent: tc.RedirectPermanent, Portals: portals, AnyTargetReset: tc.TargetReset}
	for _, a := range tc.ACL {
		if a.TargetReset && a.Initiator != "" {
			t.TargetResets = append(t.TargetResets, a.Initiator)
		}
		if src, err := a.Sources(); err != nil {
			return nil, err
		} else if src != nil && a.Initiator != "" {
			if t.Sources == nil {
				t.Sources = map[string][]netip.Prefix{}
			}
			t.Sources[a.Initiator] = src
		}
		if m, err := a.LUNMap(); err != nil {
			return nil, err
		} else if m != nil && a.Initiator != "" {
			if t.LUNMaps == nil {
				t.LUNMaps = map[string]map[uint64]uint64{}
			}
			t.LUNMaps[a.Initiator] = m
		}
	}
	for _, a := range tc.ACL {
		if a.CHAP == nil {
			continue
		}
		v, err := a.CHAP.Value()
		if err != nil {
			return nil, err
		}
		if t.InitiatorCHAP == nil {
			t.InitiatorCHAP = map[string]auth.Credentials{}
		}
		t.InitiatorCHAP[a.Initiator] = auth.Credentials{User: a.CHAP.User, Secret: v}
	}
	if tc.CHAP != nil {
		v, err := tc.CHAP.Value()
		if err != nil {
			return nil, err
		}
		t.CHAP = &auth.Credentials{User: tc.CHAP.User, Secret: v}
	}
	if tc.MutualCHAP != nil {
		v, err := tc.MutualCHAP.Value()
		if err != nil {
			return nil, err
		}
		t.MutualCHAP = &auth.Credentials{User: tc.MutualCHAP.User, Secret: v}
	}
	return t, nil
}

// portalAddrs are the addresses to register with iSNS: each listener's,
// with a wildcard one expanded to the host's addresses.
func portalAddrs(ls []net.Listener, log *slog.Logger) []netip.AddrPort {
	var out []netip.AddrPort
	for _, l := range ls {
		ap, err := netip.ParseAddrPort(l.Addr().String())
		if err != nil {
			continue
		}
		if !ap.Addr().IsUnspecified() {
			out = append(out, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
			continue
		}
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			if pfx, err := netip.ParsePrefix(a.String()); err == nil && !pfx.Addr().IsLoopback() && !pfx.Addr().IsLinkLocalUnicast() {
				out = append(out, netip.AddrPortFrom(pfx.Addr().Unmap(), ap.Port()))
			}
		}
	}
	if len(out) == 0 {
		log.Warn("iSNS: no portal address to register")
	}
	return out
}

// openRemote logs in to the LUN of an iscsi://, iser:// or srp:// URL (a
// gateway LUN).
func openRemote(ctx context.Context, u string, log *slog.Logger) (remote.Device, error) {
	if strings.HasPrefix(u, "nvme+tcp://") {
		// An NVMe namespace: the host NQN is this node's, derived once
		// from its host name, so a subsystem's hosts list can admit it.
		return tcphost.Open(ctx, u, tcphost.Options{HostNQN: gatewayHostNQN()})
	}
	if strings.HasPrefix(u, "srp://") {
		return srpinitiator.Open(ctx, u, srpinitiator.Options{Fabric: siw.New(siw.Options{Logger: log}), Logger: log})
	}
	return initiator.Open(ctx, u, initiator.Options{Dialer: &fabric.Dialer{}, Logger: log})
}

// gatewayHostNQN is the host NQN this node connects to remote NVMe
// subsystems with: config.NQNPrefix + "host:" + the host name.
func gatewayHostNQN() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "localhost"
	}
	return config.NQNPrefix + "host:" + h
}
