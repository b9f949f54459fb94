//go:build amd64 && !purego

package ib

import (
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"testing"
)

// xPowMod is x^n modulo CRC-32's polynomial, in the usual bit order.
func xPowMod(n int) uint32 {
	const poly = 0x04c11db7
	r := uint32(1)
	for range n {
		hi := r & 0x80000000
		r <<= 1
		if hi != 0 {
			r ^= poly
		}
	}
	return r
}

// TestFoldConstants recomputes crc_amd64.s's constants: x^(D+32) and
// x^(D-32) mod P, bit-reflected and shifted left by one, for D = 1024
// and 512 (the last are also hash/crc32's and Linux's fold-by-four).
func TestFoldConstants(t *testing.T) {
	k := func(n int) uint64 { return uint64(bits.Reverse32(xPowMod(n))) << 1 }
	for _, c := range []struct {
		n    int
		want uint64
	}{{1056, 0x1e88ef372}, {992, 0x14a7fe880}, {544, 0x154442bd4}, {480, 0x1c6e41596}} {
		if got := k(c.n); got != c.want {
			t.Errorf("x^%d mod P: %#x, crc_amd64.s has %#x", c.n, got, c.want)
		}
	}
}

// TestFoldUpdate checks the fold against hash/crc32 on every length up
// to 3 KiB, at every alignment mod 32, from random registers.
func TestFoldUpdate(t *testing.T) {
	if !hasFold {
		t.Skip("this processor has no VPCLMULQDQ on 256-bit registers: crcUpdate is hash/crc32 here")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 3072+32)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	var scratch [64]byte
	for n := 128; n <= 3072; n++ {
		off := n % 32
		p := buf[off : off+n]
		crc := rng.Uint32()
		if got, want := foldUpdate(crc, p, &scratch), crc32.Update(crc, crc32.IEEETable, p); got != want {
			t.Fatalf("length %d, offset %d, crc %#x: fold %#x, hash/crc32 %#x", n, off, crc, got, want)
		}
	}
	// All ones and all zeros, where a constant off by a bit still
	// cancels on some inputs.
	for _, v := range []byte{0, 0xff} {
		p := make([]byte, 4096)
		for i := range p {
			p[i] = v
		}
		for _, crc := range []uint32{0, 0xffffffff} {
			if got, want := foldUpdate(crc, p, &scratch), crc32.Update(crc, crc32.IEEETable, p); got != want {
				t.Fatalf("4096 bytes of %#x, crc %#x: fold %#x, hash/crc32 %#x", v, crc, got, want)
			}
		}
	}
}

// BenchmarkCRC puts the fold beside hash/crc32 (MB/s; their ratio is
// what counts on a noisy host), at the lengths foldMin was chosen from
// and at a RoCE packet's 4 KiB.
func BenchmarkCRC(b *testing.B) {
	for _, n := range []int{256, 512, 1024, 4096} {
		p := make([]byte, n)
		var scratch [64]byte
		b.Run("hash-crc32/"+strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crc32.Update(0, crc32.IEEETable, p)
			}
		})
		if !hasFold {
			continue
		}
		b.Run("fold/"+strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				foldUpdate(0, p, &scratch)
			}
		})
	}
}

// FuzzCRCUpdate holds crcUpdate, and the fold under it, to hash/crc32.
func FuzzCRCUpdate(f *testing.F) {
	f.Add(uint32(0), make([]byte, 600))
	f.Add(uint32(0xffffffff), []byte("a RoCEv2 payload"))
	f.Fuzz(func(t *testing.T, crc uint32, p []byte) {
		var scratch [64]byte
		want := crc32.Update(crc, crc32.IEEETable, p)
		if got := crcUpdate(crc, p, &scratch); got != want {
			t.Fatalf("crcUpdate over %d bytes from %#x: %#x, hash/crc32 %#x", len(p), crc, got, want)
		}
		if hasFold && len(p) >= 128 {
			if got := foldUpdate(crc, p, &scratch); got != want {
				t.Fatalf("fold over %d bytes from %#x: %#x, hash/crc32 %#x", len(p), crc, got, want)
			}
		}
	})
}
