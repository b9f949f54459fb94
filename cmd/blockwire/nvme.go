package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/blockwire/blockwire/blockdev"
	"github.com/blockwire/blockwire/nvme/dhchap"
	"github.com/blockwire/blockwire/nvme/tcphost"
	"github.com/blockwire/blockwire/scsi"
)

// isNVMeURL reports an nvme+tcp:// URL.
func isNVMeURL(u string) bool { return strings.HasPrefix(u, "nvme+tcp://") }

// nvmeOptions are the host's options from the client's flags: the
// digests, the host NQN from --initiator-name when that is an NQN (else
// one made from a random host ID), and DH-HMAC-CHAP: the host's secret
// from --dhchap-secret-file, the controller's (bidirectional) from
// --dhchap-ctrl-secret-file, each in the "DHHC-1:XX:…:" form. iSCSI's
// CHAP flags do not apply to an NVMe host: given, they are refused (its
// environment variables are left to iSCSI URLs).
func nvmeOptions(o clientOptions) (tcphost.Options, error) {
	h := tcphost.Options{HeaderDigest: o.HeaderDigest, DataDigest: o.DataDigest}
	if strings.HasPrefix(o.InitiatorName, "nqn.") {
		h.HostNQN = o.InitiatorName
	}
	if o.iscsiCHAP {
		return h, errors.New("iSCSI CHAP secrets given for an NVMe host: its DH-HMAC-CHAP secrets are --dhchap-secret-file and --dhchap-ctrl-secret-file")
	}
	if o.dhchap != "" {
		k, err := dhchap.ParseSecret(o.dhchap)
		if err != nil {
			return h, fmt.Errorf("--dhchap-secret-file: %w", err)
		}
		h.DHCHAP = &k
	}
	if o.dhchapCtrl != "" {
		k, err := dhchap.ParseSecret(o.dhchapCtrl)
		if err != nil {
			return h, fmt.Errorf("--dhchap-ctrl-secret-file: %w", err)
		}
		if h.DHCHAP == nil {
			return h, errors.New("--dhchap-ctrl-secret-file needs --dhchap-secret-file (the host authenticates first)")
		}
		h.DHCHAPCtrl = &k
	}
	return h, nil
}

// nvmeDevice is an NVMe namespace where the client commands take a LUN.
// It answers the two SCSI commands they send (INQUIRY, standard and the
// unit serial number page) from Identify; it has no other CDBs.
type nvmeDevice struct{ *tcphost.Device }

var errNotSCSI = errors.New("an NVMe namespace takes no SCSI command but INQUIRY")

func (d nvmeDevice) Do(_ context.Context, cdb []byte, _, in []byte) (blockdev.Result, error) {
	if len(cdb) < 6 || cdb[0] != scsi.OpInquiry {
		return blockdev.Result{}, errNotSCSI
	}
	c := d.Controller()
	var b []byte
	switch {
	case cdb[1]&1 == 0:
		b = make([]byte, 36)
		b[2], b[3], b[4] = 6, 2, 31 // SPC-4, response format 2
		scsi.PadASCII(b[8:16], "NVMe")
		scsi.PadASCII(b[16:32], c.Model())
		scsi.PadASCII(b[32:36], strings.TrimSpace(string(c.IdentifyController()[64:68])))
	case cdb[2] == 0x80:
		sn := c.Serial()
		b = append([]byte{0, 0x80, 0, byte(len(sn))}, sn...)
	default:
		return blockdev.Result{}, errNotSCSI
	}
	n := copy(in, b)
	return blockdev.Result{In: n}, nil
}

// discoverNVMe prints the discovery log of the discovery controller at
// an nvme+tcp:// URL's address: each NVM subsystem's address and NQN,
// as discover prints iSCSI targets (entries for discovery subsystems are
// left out).
func discoverNVMe(url string, o clientOptions, asJSON bool, stdout, stderr io.Writer) int {
	u, err := tcphost.ParseURL(url)
	if err != nil {
		fmt.Fprintln(stderr, "blockwire:", err)
		return exitUsage
	}
	ctx, cancel := signalContext()
	defer cancel()
	ho, err := nvmeOptions(o)
	if err != nil {
		fmt.Fprintln(stderr, "blockwire:", err)
		return exitUsage
	}
	es, err := tcphost.Discover(ctx, u.Addr, ho)
	if err != nil {
		return fail(stderr, err)
	}
	var subs []discovered
	for _, e := range es {
		if e.SubType != 2 {
			continue
		}
		i := slices.IndexFunc(subs, func(d discovered) bool { return d.Name == e.SubNQN })
		if i < 0 {
			subs = append(subs, discovered{Name: e.SubNQN, Addresses: []string{}})
			i = len(subs) - 1
		}
		subs[i].Addresses = append(subs[i].Addresses, e.Addr)
	}
	if asJSON {
		if subs == nil {
			subs = []discovered{}
		}
		writeJSON(stdout, subs)
		return exitOK
	}
	for _, s := range subs {
		for _, a := range s.Addresses {
			fmt.Fprintf(stdout, "%s %s\n", a, s.Name)
		}
	}
	return exitOK
}
