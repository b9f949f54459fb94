// Package scsi is the SCSI codec shared by every fabric: operation codes,
// status values, sense data (fixed and descriptor format, SPC-4 §4.5), CDB
// field decoding and SAM-5 LUN encoding. It does no I/O and keeps no state.
package scsi

// Status codes (SAM-5 §5.3).
const (
	StatusGood                = 0x00
	StatusCheckCondition      = 0x02
	StatusConditionMet        = 0x04
	StatusBusy                = 0x08
	StatusReservationConflict = 0x18
	StatusTaskSetFull         = 0x28
	StatusACAActive           = 0x30
	StatusTaskAborted         = 0x40
)

// Operation codes implemented or recognised by the target core.
const (
	OpTestUnitReady             = 0x00
	OpRequestSense              = 0x03
	OpFormatUnit                = 0x04
	OpRead6                     = 0x08
	OpWrite6                    = 0x0a
	OpInquiry                   = 0x12
	OpModeSelect6               = 0x15
	OpReserve6                  = 0x16
	OpRelease6                  = 0x17
	OpModeSense6                = 0x1a
	OpStartStopUnit             = 0x1b
	OpSendDiagnostic            = 0x1d
	OpPreventAllowMediumRemoval = 0x1e
	OpReadCapacity10            = 0x25
	OpRead10                    = 0x28
	OpWrite10                   = 0x2a
	OpWriteAndVerify10          = 0x2e
	OpVerify10                  = 0x2f
	OpPreFetch10                = 0x34
	OpReadDefectData10          = 0x37
	OpSynchronizeCache10        = 0x35
	OpWriteSame10               = 0x41
	OpSanitize                  = 0x48
	OpUnmap                     = 0x42
	OpModeSelect10              = 0x55
	OpReserve10                 = 0x56
	OpRelease10                 = 0x57
	OpModeSense10               = 0x5a
	OpPersistentReserveIn       = 0x5e
	OpPersistentReserveOut      = 0x5f
	OpExtendedCopy              = 0x83
	OpReceiveCopyResults        = 0x84
	OpRead16                    = 0x88
	OpCompareAndWrite           = 0x89
	OpOrWrite16                 = 0x8b
	OpWrite16                   = 0x8a
	OpWriteAndVerify16          = 0x8e
	OpVerify16                  = 0x8f
	OpPreFetch16                = 0x90
	OpSynchronizeCache16        = 0x91
	OpWriteSame16               = 0x93
	OpWriteAtomic16             = 0x9c
	OpServiceActionIn16         = 0x9e
	OpReportLuns                = 0xa0
	OpMaintenanceIn             = 0xa3
	OpMaintenanceOut            = 0xa4
	OpRead12                    = 0xa8
	OpWrite12                   = 0xaa
	OpWriteAndVerify12          = 0xae
	OpVerify12                  = 0xaf
	OpReadDefectData12          = 0xb7
)

// Service actions.
const (
	SAReadCapacity16         = 0x10 // SERVICE ACTION IN(16)
	SAGetLBAStatus           = 0x12 // SERVICE ACTION IN(16)
	SAReportSupportedOpcodes = 0x0c // MAINTENANCE IN
	SAReportTargetPortGroups = 0x0a // MAINTENANCE IN
	SASetTargetPortGroups    = 0x0a // MAINTENANCE OUT
	SASanitizeOverwrite      = 0x01 // SANITIZE
	SASanitizeBlockErase     = 0x02
	SASanitizeExitFailure    = 0x1f
)

// Sense keys (SPC-4 §4.5.6).
const (
	SenseNoSense        = 0x0
	SenseRecoveredError = 0x1
	SenseNotReady       = 0x2
	SenseMediumError    = 0x3
	SenseHardwareError  = 0x4
	SenseIllegalRequest = 0x5
	SenseUnitAttention  = 0x6
	SenseDataProtect    = 0x7
	SenseBlankCheck     = 0x8
	SenseCopyAborted    = 0xa
	SenseAbortedCommand = 0xb
	SenseMiscompare     = 0xe
)

// CDBLength returns the length of a CDB from its group code (SPC-4 §4.2.5.1),
// or 0 for the variable-length group (0x7f) and the reserved groups.
func CDBLength(opcode byte) int {
	switch opcode >> 5 {
	case 0:
		return 6
	case 1, 2:
		return 10
	case 4:
		return 16
	case 5:
		return 12
	}
	return 0
}

// PadASCII writes s into dst left-aligned, padded with spaces and cut at
// dst's length: how SPC-4's ASCII fields (T10 vendor, product, revision)
// are filled.
func PadASCII(dst []byte, s string) {
	n := copy(dst, s)
	for i := n; i < len(dst); i++ {
		dst[i] = ' '
	}
}
