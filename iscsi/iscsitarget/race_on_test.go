//go:build race

package iscsitarget

const raceEnabled = true
