//go:build !race

package tcptarget

const raceEnabled = false
