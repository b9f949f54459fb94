//go:build amd64 && !purego

#include "textflag.h"

// Folding constants of CRC-32 (IEEE 802.3) in its bit-reflected form:
// for a fold over D bits, the low quadword multiplies x^(D+32) mod P and
// the high one x^(D-32) mod P, each bit-reflected and shifted left by one
// (crc_amd64.go says how they were derived and checked).
DATA fold1024<>+0(SB)/8, $0x1e88ef372 // x^1056 mod P
DATA fold1024<>+8(SB)/8, $0x14a7fe880 // x^992 mod P
GLOBL fold1024<>(SB), RODATA, $16
DATA fold512<>+0(SB)/8, $0x154442bd4 // x^544 mod P
DATA fold512<>+8(SB)/8, $0x1c6e41596 // x^480 mod P
GLOBL fold512<>(SB), RODATA, $16

// func fold256(crc uint32, p *byte, n int, out *[64]byte)
//
// n is a multiple of 128, at least 128. The 64 bytes written to out have
// the CRC register value 0 leaves after them that crc leaves after
// p[:n] (see foldUpdate). Eight 128-bit lanes in four YMM registers each
// fold forward by 128 bytes per round with VPCLMULQDQ; then the first
// 64 bytes fold into the last 64.
TEXT ·fold256(SB), NOSPLIT, $0-32
	MOVL crc+0(FP), AX
	MOVQ p+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ out+24(FP), DI

	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVD   AX, X4 // zeroes the rest of Y4
	VPXOR   Y4, Y0, Y0
	ADDQ    $128, SI
	SUBQ    $128, CX
	VBROADCASTI128 fold1024<>(SB), Y5

loop:
	CMPQ CX, $128
	JB   tail
	VPCLMULQDQ $0x00, Y5, Y0, Y6
	VPCLMULQDQ $0x11, Y5, Y0, Y0
	VPCLMULQDQ $0x00, Y5, Y1, Y7
	VPCLMULQDQ $0x11, Y5, Y1, Y1
	VPCLMULQDQ $0x00, Y5, Y2, Y8
	VPCLMULQDQ $0x11, Y5, Y2, Y2
	VPCLMULQDQ $0x00, Y5, Y3, Y9
	VPCLMULQDQ $0x11, Y5, Y3, Y3
	VPXOR      0(SI), Y6, Y6
	VPXOR      32(SI), Y7, Y7
	VPXOR      64(SI), Y8, Y8
	VPXOR      96(SI), Y9, Y9
	VPXOR      Y6, Y0, Y0
	VPXOR      Y7, Y1, Y1
	VPXOR      Y8, Y2, Y2
	VPXOR      Y9, Y3, Y3
	ADDQ       $128, SI
	SUBQ       $128, CX
	JMP        loop

tail:
	VBROADCASTI128 fold512<>(SB), Y5
	VPCLMULQDQ $0x00, Y5, Y0, Y6
	VPCLMULQDQ $0x11, Y5, Y0, Y0
	VPCLMULQDQ $0x00, Y5, Y1, Y7
	VPCLMULQDQ $0x11, Y5, Y1, Y1
	VPXOR      Y6, Y2, Y2
	VPXOR      Y0, Y2, Y2
	VPXOR      Y7, Y3, Y3
	VPXOR      Y1, Y3, Y3
	VMOVDQU    Y2, 0(DI)
	VMOVDQU    Y3, 32(DI)
	VZEROUPPER
	RET

// func cpuid(leaf, sub uint32) (a, b, c, d uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL leaf+0(FP), AX
	MOVL sub+4(FP), CX
	CPUID
	MOVL AX, a+8(FP)
	MOVL BX, b+12(FP)
	MOVL CX, c+16(FP)
	MOVL DX, d+20(FP)
	RET
