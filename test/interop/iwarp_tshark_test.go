package interop

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/siw"
)

// TestTsharkDecodesOurIWARP captures our software iWARP device on loopback
// and has Wireshark's MPA and DDP/RDMAP dissectors (independent decoders)
// read it: MPA revision 1 and 2, CRC on and off, every RDMAP opcode we
// send, no malformed frame, and with CRC negotiated every CRC "Good".
func TestTsharkDecodesOurIWARP(t *testing.T) {
	long(t)
	need(t, "tshark")
	if os.Geteuid() != 0 {
		t.Skip("capturing on lo needs root")
	}
	for _, opt := range []siw.Options{{Revision: 2, CRC: true, MULPDU: 1000}, {Revision: 2}, {Revision: 1, CRC: true}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().String()[strings.LastIndex(ln.Addr().String(), ":")+1:]
		pcap, stop := capture(t, port)
		exchange(t, siw.New(opt), ln)
		stop()
		if dir := os.Getenv("BLOCKWIRE_KEEP_PCAP"); dir != "" {
			b, _ := os.ReadFile(pcap)
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("iwarp-rev%d-crc%v.pcap", opt.Revision, opt.CRC)), b, 0o644)
		}

		decode := []string{"-2", "-r", pcap}
		// One pass for the field list: with -2, tshark 4.0 lists only the
		// first message of a TCP segment that carries several FPDUs.
		out := stdout(t, "tshark", append(decode[1:], "-T", "fields", "-e", "iwarp_mpa.key.req", "-e", "iwarp_mpa.key.rep", "-e", "iwarp_rdma.opcode", "-e", "iwarp_mpa.rev")...)
		ops := map[string]int{}
		mpaFrames := 0
		for _, line := range strings.Split(out, "\n") {
			f := strings.Split(line, "\t")
			if len(f) < 4 {
				continue
			}
			if f[0] != "" || f[1] != "" {
				mpaFrames++
			}
			for _, op := range strings.Split(f[2], ",") {
				if op != "" {
					ops[op]++
				}
			}
		}
		if mpaFrames < 2 {
			t.Errorf("%+v: tshark saw %d MPA Request/Reply frames", opt, mpaFrames)
		}
		// RDMAP opcodes as tshark prints them.
		for _, want := range []string{"0x00", "0x01", "0x02", "0x03", "0x04", "0x05", "0x06"} {
			if ops[want] == 0 {
				t.Errorf("%+v: tshark saw no RDMAP opcode %s (saw %v)", opt, want, ops)
			}
		}
		// The CRC verdict is only in the verbose text (facts §5.2).
		verbose := stdout(t, "tshark", append(decode, "-V")...)
		good, bad := strings.Count(verbose, "(Good CRC32)"), strings.Count(verbose, "(Bad CRC32)")
		if opt.CRC && (good == 0 || bad != 0) {
			t.Errorf("%+v: CRC checks good %d bad %d", opt, good, bad)
		}
		malformed := stdout(t, "tshark", append(decode, "-T", "fields", "-e", "frame.number", "-e", "_ws.col.Info", "-Y", "_ws.malformed || _ws.expert.severity == \"error\"")...)
		for _, line := range strings.Split(strings.TrimSpace(malformed), "\n") {
			// Wireshark 4.0's RPC-over-RDMA heuristic, which looks into
			// every reassembled multi-segment Send, hits an assertion of
			// its own ("Dissector bug"); the MPA/DDP/RDMAP layers of the
			// frame dissect cleanly.
			if line == "" || strings.Contains(line, "Dissector bug, protocol RPCoRDMA") {
				continue
			}
			t.Errorf("%+v: malformed or erroneous frame: %s", opt, line)
		}
		t.Logf("%+v: %d MPA frames, RDMAP opcodes %v, CRC good %d", opt, mpaFrames, ops, good)
	}
}

// exchange runs Sends of every kind, RDMA Writes and RDMA Reads in both
// directions over one connection.
func exchange(t *testing.T, f *siw.Fabric, ln net.Listener) {
	t.Helper()
	l := f.Serve(ln)
	defer l.Close()
	mk := func() (*rdma.PD, *rdma.CQ, *rdma.CQ, *rdma.MR, []byte) {
		pd := rdma.NewDevice("tshark").AllocPD()
		mem := make([]byte, 256<<10)
		for i := range mem {
			mem[i] = byte(i * 7)
		}
		// Payload that Wireshark's RPC-over-RDMA heuristic (which reads
		// every iWARP Send, and trips over short ones) does not claim.
		copy(mem, "blockwire iWARP test payload")
		mr, err := pd.Register(mem, 0x7f0000000000, rdma.LocalWrite|rdma.RemoteRead|rdma.RemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		return pd, rdma.NewCQ(16), rdma.NewCQ(16), mr, mem
	}
	pdA, scqA, _, mrA, memA := mk()
	pdB, _, rcqB, mrB, _ := mk()
	inv, _ := pdB.AllocMR()
	invTag, _ := inv.Map(make([]byte, 64), 0, rdma.RemoteWrite)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch := make(chan rdma.QP, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err != nil {
			ch <- nil
			return
		}
		var recvs []rdma.RecvWR
		for i := 0; i < 4; i++ {
			recvs = append(recvs, rdma.RecvWR{ID: uint64(i), Buf: make([]byte, 64<<10)})
		}
		qp, _ := r.Accept(rdma.ConnParams{PD: pdB, QP: rdma.QPConfig{RecvCQ: rcqB, SendCQ: rdma.NewCQ(4)}, PrivateData: []byte("accept"), Recvs: recvs})
		ch <- qp
	}()
	qa, _, err := f.Dial(ctx, ln.Addr().String(), rdma.ConnParams{PD: pdA, QP: rdma.QPConfig{SendCQ: scqA, RecvCQ: rdma.NewCQ(4)}, PrivateData: []byte{0x80, 0, 0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	qb := <-ch
	if qb == nil {
		t.Fatal("accept failed")
	}
	wrs := []rdma.SendWR{
		{Op: rdma.OpSend, SG: [][]byte{memA[:3000]}},
		{Op: rdma.OpSend, SG: [][]byte{memA[:32]}, Solicited: true},
		{Op: rdma.OpSend, SG: [][]byte{memA[:76]}, Invalidate: true, InvalidateSTag: invTag, Solicited: true},
		{Op: rdma.OpWrite, SG: [][]byte{memA[:100000]}, RemoteSTag: mrB.STag(), RemoteTO: 0x7f0000000000 + 4096},
		{Op: rdma.OpRead, Sink: mrA, SinkTO: 0x7f0000000000, Length: 70000, RemoteSTag: mrB.STag(), RemoteTO: 0x7f0000000000 + 1},
	}
	inv2, _ := pdB.AllocMR()
	inv2Tag, _ := inv2.Map(make([]byte, 64), 0, rdma.RemoteWrite)
	wrs = append(wrs, rdma.SendWR{Op: rdma.OpSend, SG: [][]byte{memA[:40]}, Invalidate: true, InvalidateSTag: inv2Tag})
	for i := range wrs {
		if err := qa.PostSend(&wrs[i]); err != nil {
			t.Fatal(err)
		}
	}
	var cs [8]rdma.Completion
	for got := 0; got < len(wrs); {
		n, err := scqA.Wait(ctx, cs[:])
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs[:n] {
			if c.Status != rdma.Success {
				t.Fatalf("%+v: %v", c, qa.Err())
			}
		}
		got += n
	}
	for got := 0; got < 4; {
		n, err := rcqB.Wait(ctx, cs[:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	qa.Close()
	qb.Close()
}

// TestTsharkDecodesISERRFC5046 captures the RFC 5046 profile of iSER
// between the blockwire binaries: the iSCSI login in byte-stream mode,
// then MPA on the same TCP connection and iSER in RDMA Sends, Writes and
// Reads. Wireshark's iSCSI dissector reads the login and its MPA/DDP/RDMAP
// dissectors the rest, with no malformed frame (tshark 4.0 cannot decode
// iSER over iWARP itself, facts §5.2).
func TestTsharkDecodesISERRFC5046(t *testing.T) {
	long(t)
	need(t, "tshark")
	if os.Geteuid() != 0 {
		t.Skip("capturing on lo needs root")
	}
	d := serve(t, "--size", "16MiB")
	port := d.addr[strings.LastIndex(d.addr, ":")+1:]
	url := "iser://" + strings.TrimPrefix(d.url(defaultIQN, 0), "iscsi://")
	src := filepath.Join(t.TempDir(), "src")
	os.WriteFile(src, bytes.Repeat([]byte("blockwire iSER RFC 5046 profile "), 8192), 0o644)
	pcap, stop := capture(t, port)
	if out, code := blockwire(t, "write", "--overwrite", "--iser-profile", "rfc5046", url, "--in", src); code != 0 {
		t.Fatalf("write (exit %d):\n%s", code, out)
	}
	if out, code := blockwire(t, "read", "--iser-profile", "rfc5046", url, "--length", "256KiB", "--out", filepath.Join(t.TempDir(), "back")); code != 0 {
		t.Fatalf("read (exit %d):\n%s", code, out)
	}
	stop()
	// The RDMA part: MPA's heuristic finds the Request mid-stream.
	out := stdout(t, "tshark", "-r", pcap, "-T", "fields", "-e", "frame.number", "-e", "iwarp_mpa.key.req", "-e", "iwarp_rdma.opcode")
	ops := map[string]int{}
	reqs := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "\t")
		if len(f) < 3 {
			continue
		}
		if f[1] != "" {
			reqs++
		}
		for _, op := range strings.Split(f[2], ",") {
			if op != "" {
				ops[op]++
			}
		}
	}
	if reqs < 2 {
		t.Errorf("tshark found %d MPA Requests after the logins, want 2", reqs)
	}
	// Sends of every direction, the target's RDMA Writes (Data-In) and its
	// RDMA Reads of the write data (here unsolicited Data-Out Sends carry
	// part of it, InitialR2T=No).
	for _, want := range []string{"0x00", "0x03", "0x05"} {
		if ops[want] == 0 {
			t.Errorf("tshark saw no RDMAP opcode %s (saw %v)", want, ops)
		}
	}
	bad := stdout(t, "tshark", "-2", "-r", pcap, "-T", "fields", "-e", "frame.number", "-e", "_ws.col.Info", "-Y", "_ws.malformed || _ws.expert.severity == \"error\"")
	for _, line := range strings.Split(strings.TrimSpace(bad), "\n") {
		if line != "" && !strings.Contains(line, "Dissector bug, protocol RPCoRDMA") {
			t.Errorf("malformed or erroneous frame: %s", line)
		}
	}
	// The byte-stream part: the Login Request and Response as iSCSI
	// (forced on this port, so only the frames before MPA count).
	login := stdout(t, "tshark", "-2", "-r", pcap, "-d", "tcp.port=="+port+",iscsi", "-T", "fields", "-e", "frame.number", "-e", "iscsi.opcode", "-Y", "iscsi.opcode == 0x03 || iscsi.opcode == 0x23")
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(login), "\n") {
		if line != "" {
			n++
		}
	}
	if n < 4 {
		t.Errorf("tshark decoded %d Login PDUs, want a request and a response per connection:\n%s", n, login)
	}
	t.Logf("%d MPA Requests, RDMAP opcodes %v, %d login PDUs", reqs, ops, n)
}
