package target

import (
	"encoding/binary"
	"io"
	"testing"

	"github.com/blockwire/blockwire/iscsi/pdu"
)

// benchIO runs QD1 READ(10) or WRITE(10) commands of size bytes through a
// real TCP connection with an allocation-free client loop, so that
// allocs/op is what the target spends per I/O.
func benchIO(b *testing.B, write bool, size int) {
	ts := startServer(b, Options{NopInterval: -1}, nil)
	c := dial(b, ts.addr)
	c.mustLogin(normalKeys(ini, kv("ImmediateData", "Yes"), kv("FirstBurstLength", "262144"), kv("MaxBurstLength", "262144"))...)
	c.command(tur(), false, 0, nil, 0)
	data := make([]byte, size)
	rbuf := make([]byte, 512<<10)
	var h pdu.BHS
	frame := make([]byte, 0, pdu.BHSLen+size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cmd := pdu.SCSICommand{Final: true, Read: !write, Write: write, ITT: uint32(i), EDTL: uint32(size), CmdSN: c.cmdSN, ExpStatSN: c.expStatSN}
		c.cmdSN++
		cdb := read10(uint32(i%1024)*8, uint16(size/512))
		if write {
			cdb[0] = 0x2a
		}
		copy(cmd.CDB[:], cdb)
		cmd.Encode(&h)
		frame = frame[:0]
		if write {
			h.SetDataSegmentLength(size)
			frame = append(append(frame, h[:]...), data...)
		} else {
			frame = append(frame, h[:]...)
		}
		if _, err := c.nc.Write(frame); err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := io.ReadFull(c.r, h[:]); err != nil {
				b.Fatal(err)
			}
			n := pdu.PaddedLen(h.DataSegmentLength())
			if _, err := io.ReadFull(c.r, rbuf[:n]); err != nil {
				b.Fatal(err)
			}
			op := h.Opcode()
			if op == pdu.OpSCSIResponse || (op == pdu.OpDataIn && h[1]&1 != 0) {
				if h[3] != 0 {
					b.Fatalf("status %#x", h[3])
				}
				c.expStatSN = binary.BigEndian.Uint32(h[24:]) + 1
				break
			}
		}
	}
}

func BenchmarkRead4K(b *testing.B)   { benchIO(b, false, 4096) }
func BenchmarkWrite4K(b *testing.B)  { benchIO(b, true, 4096) }
func BenchmarkRead128K(b *testing.B) { benchIO(b, false, 128<<10) }
