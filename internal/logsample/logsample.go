// Package logsample decides which occurrences of a repeated event are
// logged: the first few, then one in 1024. A peer that repeats something in
// a loop (a PDU refused, a login left unfinished, a task management
// function) then cannot flood the log, and the count logged with each
// line says how often it happened. Every such log of blockwire uses it.
package logsample

// Integer is the counters Keep takes.
type Integer interface {
	~int | ~int32 | ~int64 | ~uint32 | ~uint64
}

// First is how many occurrences Keep logs before it samples; Every is one
// in how many it logs after that.
const (
	First = 16
	Every = 1024
)

// Keep reports whether occurrence n (counted from 1) is logged: the first
// First, then one in Every.
func Keep[T Integer](n T) bool { return KeepFirst(n, First) }

// KeepFirst is Keep logging the first first occurrences.
func KeepFirst[T Integer](n, first T) bool { return n <= first || n%Every == 0 }
