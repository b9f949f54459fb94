// Package serial implements RFC 1982 serial-number arithmetic for 32-bit
// sequence numbers (SERIAL_BITS = 32), as RFC 7143 §4.2.2.1 requires for
// CmdSN, ExpCmdSN, MaxCmdSN, StatSN, DataSN and R2TSN.
package serial

// Number is a 32-bit serial number.
type Number uint32

// LessThan reports whether a < b in RFC 1982 §3.2 terms. Two numbers exactly
// 2^31 apart are incomparable; LessThan then reports false both ways.
func LessThan(a, b uint32) bool {
	return (a < b && b-a < 1<<31) || (a > b && a-b > 1<<31)
}

// GreaterThan reports whether a > b in RFC 1982 §3.2 terms.
func GreaterThan(a, b uint32) bool { return LessThan(b, a) }

// LessOrEqual reports a == b || a < b.
func LessOrEqual(a, b uint32) bool { return a == b || LessThan(a, b) }

// InWindow reports whether sn lies within [lo, hi] in serial arithmetic,
// which is how RFC 7143 §4.2.2.1 defines the command window
// ExpCmdSN <= CmdSN <= MaxCmdSN.
func InWindow(sn, lo, hi uint32) bool {
	return LessOrEqual(lo, sn) && LessOrEqual(sn, hi)
}
