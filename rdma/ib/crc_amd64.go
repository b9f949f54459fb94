//go:build amd64 && !purego

package ib

import (
	"hash/crc32"

	"golang.org/x/sys/cpu"
)

// The ICRC's payload runs through CRC-32 (IEEE 802.3), the largest cost of
// a software RoCEv2 packet after the kernel's copies (11-12 % of
// each side's CPU for 128 KiB iSER reads). hash/crc32 folds 16 bytes per
// carry-less multiply on 128-bit registers (11.7 GB/s on the 2026 AMD EPYC
// hosts); processors with VPCLMULQDQ on 256-bit registers (AMD Zen 3 on,
// Intel Ice Lake on) multiply two lanes at once, which hash/crc32 (Go
// 1.26) and klauspost/crc32 use only on 512-bit registers, with AVX-512: a
// processor with AVX2 alone (AMD Zen 3, the hosts here) gets 128 bits.
// fold256 keeps eight 128-bit lanes in flight; with AVX-512, hash/crc32's
// own loop runs instead. It only folds: the 64 bytes it leaves are a
// shorter message with the same CRC register value, which hash/crc32 then
// finishes (its own fold and reduction), so the one piece of arithmetic
// hand-written here is the forward fold.
//
// The constants (crc_amd64.s) are x^(D±32) mod P for the fold distance D
// (1024 bits in the loop, 512 for the last step) in the bit-reflected
// form hash/crc32 and Linux use; TestFoldConstants recomputes them, and
// TestFoldUpdate checks the whole against hash/crc32 on every length.

// hasFold says the processor has AVX2 and VPCLMULQDQ (CPUID leaf 7, ECX
// bit 10), the kernel saves the YMM registers, and hash/crc32 has no
// AVX-512 loop to run instead.
var hasFold = foldSupported()

func foldSupported() bool {
	if !cpu.X86.HasAVX2 || !cpu.X86.HasPCLMULQDQ || cpu.X86.HasAVX512VPCLMULQDQ {
		return false
	}
	_, _, c, _ := cpuid(7, 0)
	return c&(1<<10) != 0
}

// foldMin is the length from which folding pays for the 64 bytes it
// leaves to hash/crc32 (BenchmarkCRC).
const foldMin = 512

//go:noescape
func fold256(crc uint32, p *byte, n int, out *[64]byte)

func cpuid(leaf, sub uint32) (a, b, c, d uint32)

// crcUpdate is crc32.Update(crc, crc32.IEEETable, p); scratch is room
// for the folded bytes (hash/crc32's assembly would make a local escape).
func crcUpdate(crc uint32, p []byte, scratch *[64]byte) uint32 {
	if !hasFold || len(p) < foldMin {
		return crc32.Update(crc, crc32.IEEETable, p)
	}
	return foldUpdate(crc, p, scratch)
}

// foldUpdate folds the whole 128-byte blocks of p (at least one) into 64
// bytes and hands those and the rest of p to hash/crc32.
//
// Why that is exact: crc32.Update(crc, p) is the complement of the
// register a CRC leaves after p starting from ^crc, and starting from a
// register r over p is starting from 0 over p with r added into its first
// four bytes. The fold turns those bytes into 64 whose polynomial is
// congruent to theirs modulo P at the same end position, so the register
// after them, from 0, is the same; crc32.Update(0xffffffff, ·) is exactly
// "from 0, complemented".
func foldUpdate(crc uint32, p []byte, scratch *[64]byte) uint32 {
	n := len(p) &^ 127
	fold256(^crc, &p[0], n, scratch)
	c := crc32.Update(0xffffffff, crc32.IEEETable, scratch[:])
	return crc32.Update(c, crc32.IEEETable, p[n:])
}
