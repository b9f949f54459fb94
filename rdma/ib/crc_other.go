//go:build !amd64 || purego

package ib

import "hash/crc32"

// crcUpdate is crc32.Update(crc, crc32.IEEETable, p) (crc_amd64.go folds
// long runs on processors that can).
func crcUpdate(crc uint32, p []byte, _ *[64]byte) uint32 {
	return crc32.Update(crc, crc32.IEEETable, p)
}
