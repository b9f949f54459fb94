//go:build !race

package iscsitarget

const raceEnabled = false
