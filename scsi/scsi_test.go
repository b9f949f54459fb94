package scsi

import (
	"testing"
)

func TestSenseFormats(t *testing.T) {
	s := InvalidFieldInCDB(2, 5)
	fixed := s.AppendFixed(nil)
	if len(fixed) != FixedLen || fixed[0] != 0x70 || fixed[2] != SenseIllegalRequest || fixed[12] != 0x24 {
		t.Fatalf("fixed sense % x", fixed)
	}
	if fixed[15] != 0x80|0x40|0x08|5 || fixed[17] != 2 {
		t.Fatalf("field pointer bytes % x", fixed[15:18])
	}
	desc := LBAOutOfRange(0x1234567890).AppendDescriptor(nil)
	if desc[0] != 0x72 || desc[1] != SenseIllegalRequest || desc[2] != 0x21 || int(desc[7]) != len(desc)-8 {
		t.Fatalf("descriptor sense % x", desc)
	}
	for _, b := range [][]byte{fixed, desc, s.AppendDescriptor(nil), LBAOutOfRange(7).AppendFixed(nil)} {
		p, err := ParseSense(b)
		if err != nil {
			t.Fatal(err)
		}
		if p.Key != SenseIllegalRequest {
			t.Fatalf("parsed key %x", p.Key)
		}
	}
	p, _ := ParseSense(desc)
	if !p.Valid || p.Information != 0x1234567890 {
		t.Fatalf("information lost: %+v", p)
	}
	p, _ = ParseSense(fixed)
	if !p.FieldPointer || !p.InCDB || p.Field != 2 || p.Bit != 5 {
		t.Fatalf("field pointer lost: %+v", p)
	}
	if s.Error() == "" {
		t.Fatal("empty error text")
	}
}

func TestDecodeRW(t *testing.T) {
	r, err := DecodeRW([]byte{OpRead6, 0x1f, 0xff, 0xff, 0, 0})
	if err != nil || r.LBA != 0x1fffff || r.Blocks != 256 {
		t.Fatalf("READ(6): %+v %v", r, err)
	}
	r, err = DecodeRW([]byte{OpWrite10, 0x08, 0, 0, 0x10, 0, 0, 0, 8, 0})
	if err != nil || r.LBA != 0x1000 || r.Blocks != 8 || !r.FUA {
		t.Fatalf("WRITE(10): %+v %v", r, err)
	}
	r, err = DecodeRW([]byte{OpRead16, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0})
	if err != nil || r.LBA != 1<<32 || r.Blocks != 256 {
		t.Fatalf("READ(16): %+v %v", r, err)
	}
	r, err = DecodeRW([]byte{OpRead12, 0, 0, 0, 0, 9, 0, 1, 0, 0, 0, 0})
	if err != nil || r.LBA != 9 || r.Blocks != 65536 {
		t.Fatalf("READ(12): %+v %v", r, err)
	}
	if _, err := DecodeRW([]byte{OpRead10, 0, 0}); err == nil {
		t.Fatal("short CDB accepted")
	}
}

func TestLUN(t *testing.T) {
	for _, l := range []uint64{0, 1, 255, 256, 16383} {
		got, err := DecodeLUN(EncodeLUN(l))
		if err != nil || got != l {
			t.Errorf("LUN %d round trip: %d %v", l, got, err)
		}
	}
	if _, err := DecodeLUN([8]byte{0, 1, 0, 1}); err == nil {
		t.Error("second-level LUN accepted")
	}
	if _, err := DecodeLUN([8]byte{0x80}); err == nil {
		t.Error("logical unit addressing accepted")
	}
}

func FuzzParseSense(f *testing.F) {
	f.Add(InvalidFieldInCDB(1, 2).AppendFixed(nil))
	f.Add(LBAOutOfRange(9).AppendDescriptor(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSense(b)
		if err != nil {
			return
		}
		// Re-encoding a parsed sense must parse to the same key and codes.
		for _, enc := range [][]byte{s.AppendFixed(nil), s.AppendDescriptor(nil)} {
			s2, err := ParseSense(enc)
			if err != nil || s2.Key != s.Key || s2.ASC != s.ASC || s2.ASCQ != s.ASCQ {
				t.Fatalf("re-encoded sense differs: %+v vs %+v (%v)", s2, s, err)
			}
		}
	})
}

func FuzzDecodeRW(f *testing.F) {
	f.Add([]byte{OpWrite10, 0x08, 0, 0, 0x10, 0, 0, 0, 8, 0})
	f.Add([]byte{OpRead16, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, cdb []byte) {
		r, err := DecodeRW(cdb)
		if err != nil {
			return
		}
		if CDBLength(cdb[0]) == 6 && r.LBA > 0x1fffff {
			t.Fatalf("6-byte CDB with LBA %#x", r.LBA)
		}
		_, _ = AllocationLength(cdb)
	})
}
