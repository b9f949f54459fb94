package iscsitarget

import (
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/blockwire/blockwire/backend/file"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/internal/sockpoll"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/scsitarget"
)

// ioLoop returns a function that runs one QD1 READ(10) or WRITE(10) of
// size bytes through a real TCP connection with an allocation-free client,
// so that allocations per call are what the target spends per I/O.
func ioLoop(tb testing.TB, write bool, size int) func(i int) {
	return ioLoopOn(tb, write, size, nil)
}

// ioLoopOn is ioLoop on the target mod makes.
func ioLoopOn(tb testing.TB, write bool, size int, mod func(*Target)) func(i int) {
	return batchLoop(tb, write, size, 1, mod)
}

// batchLoop returns a function that sends n READ(10)s or WRITE(10)s of size
// bytes in one write and waits for their n answers, with an
// allocation-free client.
func batchLoop(tb testing.TB, write bool, size, n int, mod func(*Target)) func(i int) {
	return batchLoopAt(tb, startServer(tb, Options{NopInterval: -1}, mod), write, size, n)
}

// batchLoopAt is batchLoop against ts.
func batchLoopAt(tb testing.TB, ts *testServer, write bool, size, n int) func(i int) {
	c := dial(tb, ts.addr)
	c.mustLogin(normalKeys(ini, kv("ImmediateData", "Yes"), kv("FirstBurstLength", "262144"), kv("MaxBurstLength", "262144"))...)
	c.command(tur(), false, 0, nil, 0)
	data := make([]byte, size)
	rbuf := make([]byte, 512<<10)
	var h pdu.BHS
	frame := make([]byte, 0, n*(pdu.BHSLen+size))
	return func(i int) {
		frame = frame[:0]
		for k := range n {
			itt := uint32(n*i + k)
			cmd := pdu.SCSICommand{Final: true, Read: !write, Write: write, ITT: itt, EDTL: uint32(size), CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}
			c.cmdSN++
			cdb := read10(itt%1024*8, uint16(size/512))
			if write {
				cdb[0] = 0x2a
			}
			copy(cmd.CDB[:], cdb)
			cmd.Encode(&h)
			if write {
				h.SetDataSegmentLength(size)
			}
			frame = append(frame, h[:]...)
			if write {
				frame = append(frame, data...)
			}
		}
		if _, err := c.nc.Write(frame); err != nil {
			tb.Fatal(err)
		}
		for done := 0; done < n; {
			if _, err := io.ReadFull(c.r, h[:]); err != nil {
				tb.Fatal(err)
			}
			if _, err := io.ReadFull(c.r, rbuf[:pdu.PaddedLen(h.DataSegmentLength())]); err != nil {
				tb.Fatal(err)
			}
			if op := h.Opcode(); op == pdu.OpSCSIResponse || (op == pdu.OpDataIn && h[1]&1 != 0) {
				if h[3] != 0 {
					tb.Fatalf("status %#x", h[3])
				}
				c.expStatSN = max(c.expStatSN, binary.BigEndian.Uint32(h[24:])+1)
				done++
			}
		}
	}
}

// pairLoop returns a function that sends two 4 KiB READs (or WRITEs) in one
// write and waits for both answers: the first command finds the second
// buffered behind it, so it goes to a worker and its answer is sent with
// More (the path of commands that arrive together).
func pairLoop(tb testing.TB, write bool) func(i int) { return batchLoop(tb, write, 4096, 2, nil) }

func benchIO(b *testing.B, write bool, size int) {
	io := ioLoop(b, write, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		io(i)
	}
}

// TestNoAllocationsPerIO keeps the I/O path allocation-free: reads and
// writes of 4 KiB and 128 KiB through login, CmdSN ordering, the SCSI core,
// the memory backend and the TCP datamover. (The race detector allocates
// on its own; .ci/run runs this test without it.)
func TestNoAllocationsPerIO(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race; .ci/run runs this test without it")
	}
	for _, tc := range []struct {
		write bool
		size  int
	}{{false, 4096}, {true, 4096}, {false, 128 << 10}, {true, 128 << 10}} {
		io := ioLoop(t, tc.write, tc.size)
		for i := range 200 {
			io(i) // warm the pools
		}
		i := 0
		if a := testing.AllocsPerRun(500, func() { io(i); i++ }); a > 0.1 {
			t.Errorf("write=%v size=%d: %.2f allocations per I/O, want 0", tc.write, tc.size, a)
		}
		// The same through a connection that polls (raw reads and
		// writes: datamover/tcp's poller and rawWriter).
		polling := func(l net.Listener) *fabric.TCPAcceptor {
			a := fabric.TCP(l)
			a.Poll = sockpoll.NewGroup(20 * time.Microsecond)
			return a
		}
		io = batchLoopAt(t, startServerOn(t, Options{NopInterval: -1}, nil, os.Stderr, polling), tc.write, tc.size, 1)
		for i := range 200 {
			io(i)
		}
		if a := testing.AllocsPerRun(500, func() { io(i); i++ }); a > 0.1 {
			t.Errorf("polling: write=%v size=%d: %.2f allocations per I/O, want 0", tc.write, tc.size, a)
		}
		// The same on a file LUN, on each of its I/O paths.
		for _, o := range []file.Options{{Engine: file.EngineURing}, {Engine: file.EnginePread}, {Engine: file.EngineURing, Direct: true, BlockSize: 512}} {
			io := ioLoopOn(t, tc.write, tc.size, onFile(t, o))
			for i := range 200 {
				io(i)
			}
			if a := testing.AllocsPerRun(500, func() { io(i); i++ }); a > 0.1 {
				t.Errorf("file LUN %+v: write=%v size=%d: %.2f allocations per I/O, want 0", o, tc.write, tc.size, a)
			}
		}
	}
}

// TestNoAllocationsPerPipelinedIO: the same for commands that arrive
// together (pairLoop).
func TestNoAllocationsPerPipelinedIO(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race; .ci/run runs this test without it")
	}
	for _, write := range []bool{false, true} {
		io := pairLoop(t, write)
		for i := range 200 {
			io(i)
		}
		i := 200
		if a := testing.AllocsPerRun(500, func() { io(i); i++ }); a > 0.2 {
			t.Errorf("write=%v: %.2f allocations per pair of I/Os, want 0", write, a)
		}
	}
}

// onFile puts the target's LUN 0 on a file opened with o.
func onFile(t *testing.T, o file.Options) func(*Target) {
	o.Size = 16 << 20
	be, err := file.Open(filepath.Join(t.TempDir(), "lun.img"), o)
	if err != nil {
		t.Fatal(err)
	}
	return onLU(t, scsitarget.LUConfig{Backend: be})
}

// onLU gives the target one LU, LUN 0, as cfg says (closed when the test
// ends).
func onLU(t testing.TB, cfg scsitarget.LUConfig) func(*Target) {
	return func(tg *Target) {
		lu, err := scsitarget.NewLU(testIQN, cfg)
		if err != nil {
			t.Fatal(err)
		}
		dev := scsitarget.NewDevice(testIQN, slog.New(slog.DiscardHandler))
		dev.AddLU(lu)
		tg.Device = dev
		t.Cleanup(func() { lu.Close() })
	}
}

func BenchmarkRead4K(b *testing.B)   { benchIO(b, false, 4096) }
func BenchmarkWrite4K(b *testing.B)  { benchIO(b, true, 4096) }
func BenchmarkRead128K(b *testing.B) { benchIO(b, false, 128<<10) }
