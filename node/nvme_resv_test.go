package node_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/node"
	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/tcphost"
	"github.com/blockwire/blockwire/scsi"
)

// TestReservationsAcrossFabrics: an LU served over iSCSI and NVMe/TCP has
// one reservation state. An NVMe host's Write Exclusive reservation
// refuses another host's writes and an iSCSI initiator's, but not their
// reads; the iSCSI initiator sees the NVMe host's key in READ KEYS; a
// second host preempts the first to Exclusive Access, which then refuses
// the first host's reads too; the iSCSI initiator preempts that in turn
// and the NVMe hosts' writes are refused; Clear ends it all. NVMe's own
// rules hold on the way: registering again with another key conflicts,
// a new key of 0 is invalid, a report without the extended data
// structure is refused (128-bit host identifiers), and the report names
// the holder's controller.
func TestReservationsAcrossFabrics(t *testing.T) {
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, NVMeListen: []string{"127.0.0.1:0"},
		Targets: []config.Target{{Name: diskA, Hosts: []string{hostA, hostB}, LUNs: []config.LUN{{ID: 0, Size: "8MiB"}}}}}
	n := startNode(t, cfg, node.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nv := portal(t, n, config.NVMeTCP)
	nqn := config.NQNPrefix + diskA
	a, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostA, HostID: [16]byte{0xa}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostB, HostID: [16]byte{0xb}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, err := initiator.Login(ctx, portal(t, n, config.ISCSI), diskA, initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Do(ctx, 0, make([]byte, 6), nil, nil) // TEST UNIT READY: takes the session's first unit attention

	status := func(err error) nvme.Status {
		var se *tcphost.StatusError
		if errors.As(err, &se) {
			return se.Status
		}
		if err != nil {
			t.Fatalf("not a status: %v", err)
		}
		return 0
	}
	const conflict = 0x83
	expect := func(what string, err error, sc uint8) {
		t.Helper()
		if got := status(err); got.SC() != sc || got.SCT() != 0 {
			t.Fatalf("%s: %v, want generic status %#x", what, err, sc)
		}
	}
	blk := make([]byte, 512)
	scsiWrite := func() error {
		cdb := make([]byte, 16)
		cdb[0] = 0x8a
		binary.BigEndian.PutUint32(cdb[10:], 1)
		_, err := s.Do(ctx, 0, cdb, blk, nil)
		return err
	}
	scsiConflict := func(err error) bool {
		var se *initiator.SCSIError
		return errors.As(err, &se) && se.Status == 0x18
	}

	expect("register key 0", a.ResvRegister(ctx, 1, tcphost.ResvRegister, 0, 0, false, 0), 0x02)
	expect("register", a.ResvRegister(ctx, 1, tcphost.ResvRegister, 0, 0xaa, false, 0), 0)
	expect("register again, same key", a.ResvRegister(ctx, 1, tcphost.ResvRegister, 0, 0xaa, false, 0), 0)
	expect("register again, other key", a.ResvRegister(ctx, 1, tcphost.ResvRegister, 0, 0xab, false, 0), conflict)
	expect("acquire with a wrong key", a.ResvAcquire(ctx, 1, 0, 1, 0xab, 0), conflict)
	expect("acquire WE", a.ResvAcquire(ctx, 1, 0, 1, 0xaa, 0), 0)
	expect("host A writes", a.Write(ctx, 1, 512, 0, blk, false), 0)
	expect("host B writes under A's WE", b.Write(ctx, 1, 512, 0, blk, false), conflict)
	expect("host B reads under A's WE", b.Read(ctx, 1, 512, 0, blk), 0)
	expect("host B flushes under A's WE", b.Flush(ctx, 1), conflict)
	if err := scsiWrite(); !scsiConflict(err) {
		t.Fatalf("iSCSI write under an NVMe host's WE: %v, want RESERVATION CONFLICT", err)
	}
	keys := make([]byte, 64)
	if _, err := s.Do(ctx, 0, []byte{0x5e, 0, 0, 0, 0, 0, 0, 0, 64, 0}, nil, keys); err != nil {
		t.Fatal(err)
	}
	if binary.BigEndian.Uint32(keys[4:]) != 8 || binary.BigEndian.Uint64(keys[8:]) != 0xaa {
		t.Fatalf("READ KEYS %x: want the NVMe host's key 0xaa alone", keys[:16])
	}

	// B registers and preempts A, taking Exclusive Access.
	expect("B registers", b.ResvRegister(ctx, 1, tcphost.ResvRegister, 0, 0xbb, false, 0), 0)
	expect("B preempts with key 0", b.ResvAcquire(ctx, 1, 1, 2, 0xbb, 0), 0x02)
	expect("B preempts A", b.ResvAcquire(ctx, 1, 1, 2, 0xbb, 0xaa), 0)
	expect("A reads under B's EA", a.Read(ctx, 1, 512, 0, blk), conflict)
	expect("A writes under B's EA", a.Write(ctx, 1, 512, 0, blk, false), conflict)
	expect("B writes", b.Write(ctx, 1, 512, 0, blk, true), 0)
	expect("A's key is gone", a.ResvRelease(ctx, 1, 2, 0xaa, false), conflict)
	// A's controller has the notice: Registration Preempted on
	// namespace 1, read once.
	log, err := a.LogPage(ctx, 0x80, 0, 0, 64)
	if err != nil || log[8] != 1 || binary.LittleEndian.Uint32(log[12:]) != 1 || binary.LittleEndian.Uint64(log) == 0 {
		t.Fatalf("A's reservation notification log %x, %v: want Registration Preempted on namespace 1", log[:16], err)
	}
	if log, err := a.LogPage(ctx, 0x80, 0, 0, 64); err != nil || binary.LittleEndian.Uint64(log) != 0 {
		t.Fatalf("the log read again %x, %v: want no notice", log[:16], err)
	}
	// B masks Registration Preempted on namespace 1.
	if _, err := b.Admin(ctx, &nvme.Command{Opcode: nvme.AdminSetFeatures, NSID: 1, CDW: [6]uint32{0x82, 1 << 1}}, nil, tcphost.NoData); err != nil {
		t.Fatal(err)
	}

	rep := make([]byte, 4096)
	_, err = b.IO(ctx, &nvme.Command{Opcode: nvme.OpResvReport, NSID: 1, CDW: [6]uint32{1023, 0}}, rep, tcphost.FromController)
	expect("report without EDS", err, 0x18)
	st, err := b.ResvReport(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if st.Type != 2 || len(st.Registrants) != 1 || !st.Registrants[0].Holder || st.Registrants[0].Key != 0xbb ||
		st.Registrants[0].CNTLID != b.ID() || st.Registrants[0].HostID != [16]byte{0xb} || st.Generation < 3 {
		t.Fatalf("report %+v: want B alone, holding EA, its controller %d", st, b.ID())
	}

	// The iSCSI initiator registers and preempts B.
	prOut := func(sa, typ byte, key, sakey uint64) error {
		p := make([]byte, 24)
		binary.BigEndian.PutUint64(p, key)
		binary.BigEndian.PutUint64(p[8:], sakey)
		_, err := s.Do(ctx, 0, []byte{0x5f, sa, typ, 0, 0, 0, 0, 0, 24, 0}, p, nil)
		var se *initiator.SCSIError
		if errors.As(err, &se) && se.Sense != nil && se.Sense.Key == scsi.SenseUnitAttention {
			_, err = s.Do(ctx, 0, []byte{0x5f, sa, typ, 0, 0, 0, 0, 0, 24, 0}, p, nil)
		}
		return err
	}
	if err := prOut(0, 0, 0, 0x55); err != nil {
		t.Fatal(err)
	}
	if err := prOut(4, 1, 0x55, 0xbb); err != nil { // PREEMPT, Write Exclusive
		t.Fatal(err)
	}
	expect("B writes after the iSCSI preemption", b.Write(ctx, 1, 512, 0, blk, false), conflict)
	if log, err := b.LogPage(ctx, 0x80, 0, 0, 64); err != nil || binary.LittleEndian.Uint64(log) != 0 {
		t.Fatalf("B's log %x, %v: want nothing (masked)", log[:16], err)
	}
	expect("B reads after the iSCSI preemption", b.Read(ctx, 1, 512, 0, blk), 0)
	if err := scsiWrite(); err != nil {
		t.Fatalf("the holder's iSCSI write: %v", err)
	}
	st, err = a.ResvReport(ctx, 1)
	if err != nil || st.Type != 1 || len(st.Registrants) != 1 || st.Registrants[0].CNTLID != 0xffff || st.Registrants[0].Key != 0x55 {
		t.Fatalf("report %+v, %v: want the iSCSI initiator alone holding WE", st, err)
	}
	// An NVMe host registers and clears everything.
	expect("A registers", a.ResvRegister(ctx, 1, tcphost.ResvRegister, 0, 0xa1, false, 0), 0)
	expect("A replaces with a wrong key", a.ResvRegister(ctx, 1, tcphost.ResvReplace, 0xa0, 0xa2, false, 0), conflict)
	expect("A replaces", a.ResvRegister(ctx, 1, tcphost.ResvReplace, 0xa1, 0xa2, false, 0), 0)
	expect("A clears", a.ResvRelease(ctx, 1, 0, 0xa2, true), 0)
	expect("B writes after the clear", b.Write(ctx, 1, 512, 0, blk, false), 0)
	if st, err := a.ResvReport(ctx, 1); err != nil || st.Type != 0 || len(st.Registrants) != 0 {
		t.Fatalf("report after Clear %+v, %v: want nothing", st, err)
	}
}
