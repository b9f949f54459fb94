package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/anishathalye/porcupine"
)

// The model: each block is a register with the durability SBC-4 promises
// (§4.15, §5.24 SYNCHRONIZE CACHE; the FUA bit of WRITE(16)):
//
//   - a write acknowledged with FUA is durable at once;
//   - a write acknowledged without it is durable once a SYNCHRONIZE CACHE
//     acknowledged after it;
//   - a crash (power lost under the target) leaves each block holding its
//     last durable value or any value written after it that was not yet
//     durable — never an older one, never one that was not written;
//   - a read returns the block's value at some instant between its call
//     and its return (linearizability). A read that overlaps a write of
//     the same block may return part of each: SCSI orders no overlapping
//     commands of simple tasks and promises no atomicity short of its
//     atomic write commands (SBC-4's WRITE ATOMIC), and Linux's page
//     cache gives none between a pread and a pwrite of one page, so a
//     file LUN shows it. Such a read enters the history once per value
//     it holds, each with the read's times: every part must be a value
//     the block held while it ran (a value of which the read holds only
//     some bytes, in the block's first or last word, by those bytes).
//
// A write that ended in an error may or may not have happened: it takes
// effect at some point after its call, or never (its return is the end
// of time). Reads and flushes that failed are left out (they say
// nothing). Crashes and flushes concern every block: the history is cut
// per block with a copy of each in every part.
//
// With persistent reservations (the "preempt" fault; SPC-4 §5.13), the
// LU has a Write Exclusive – Registrants Only reservation and every
// client registers its key on each of its sessions (I_T nexuses). A write
// takes effect only while its nexus is registered: after a PREEMPT AND
// ABORT of the client's key completed, no write of it sent before — in
// flight, queued, delayed in the network — may land, until that nexus
// registers again.

// opKind is what an operation does.
type opKind uint8

const (
	opRead opKind = iota
	opWrite
	opSync     // SYNCHRONIZE CACHE, acknowledged
	opCrash    // the target lost power and came back
	opPreempt  // PERSISTENT RESERVE OUT PREEMPT AND ABORT of victim's key
	opRegister // the client registered its key on nexus
)

// input is an operation's input.
type input struct {
	kind  opKind
	block int
	value uint64 // written
	// fua is the write's FUA bit on the wire; durable, that the write is
	// durable once acknowledged (FUA, or the LU's write cache is off).
	fua, durable bool
	// nexus is the session a write came on or a registration was made
	// on (0: reservations are not in play); victim is the client whose
	// key a preemption removed, or the target (gateway) a crash ended.
	nexus, victim int
}

// output is an operation's result: the value a read returned; unknown
// for an operation that ended in an error (it happened or not).
type output struct {
	value uint64
	// mask, when not 0, says a read saw only these bytes of value (the
	// rest of the word was another value's: values in client.go).
	mask    uint64
	unknown bool
	// failed is when the client saw an unknown operation fail (0: not
	// known); via, the targets (gateways: bit k for gateway k) its
	// session had logged in to, which it may have reached. The checker
	// of stretches bounds its effect by the first crash of each of them,
	// or the client's next login there, after it (segments.go).
	failed int64
	via    uint64
	// quiesce, when not 0, is how long after failed the operation may
	// still take effect at most, whatever else happens: over NVMe/TCP a
	// new controller does not end the old one's commands as a
	// reinstated iSCSI session does, but the target ends a lost
	// controller's commands within its keep-alive timeout (nvmeQuiesce).
	quiesce int64
}

// regState is one block's state. vol lists the values written since the
// last durable one (sorted, no repeats), as a string so states compare.
type regState struct {
	cur, durable uint64
	vol          string
	reg          string // registered nexuses: byte n is 1 when n is
}

func (s regState) registered(n int) bool { return n < len(s.reg) && s.reg[n] == 1 }

func (s regState) withRegistration(n int, on bool) regState {
	b := []byte(s.reg)
	for len(b) <= n {
		b = append(b, 0)
	}
	b[n] = 0
	if on {
		b[n] = 1
	}
	s.reg = string(b)
	return s
}

func (s regState) volatile() []uint64 {
	if s.vol == "" {
		return nil
	}
	var out []uint64
	for _, f := range strings.Split(s.vol, ",") {
		v, _ := strconv.ParseUint(f, 16, 64)
		out = append(out, v)
	}
	return out
}

func withVolatile(s regState, v uint64) regState {
	vs := s.volatile()
	if !slices.Contains(vs, v) {
		vs = append(vs, v)
		slices.Sort(vs)
	}
	f := make([]string, len(vs))
	for i, x := range vs {
		f[i] = strconv.FormatUint(x, 16)
	}
	s.vol = strings.Join(f, ",")
	return s
}

// newModel is the model; owner names the client of each nexus (for
// preemptions).
func newModel(owner map[int]int) porcupine.NondeterministicModel {
	m := modelDescriptions
	m.Partition = partition
	m.Init = func() []any { return []any{regState{}} }
	m.Step = func(st, in, out any) []any {
		s, i := st.(regState), in.(input)
		o, _ := out.(output) // nil for an operation that returns nothing
		// maybe is the states after an operation that happened or, when
		// its outcome is unknown, may not have.
		maybe := func(next regState) []any {
			if o.unknown {
				return []any{s, next}
			}
			return []any{next}
		}
		switch i.kind {
		case opRead:
			if o.value == s.cur || o.mask != 0 && (o.value^s.cur)&o.mask == 0 {
				return []any{s}
			}
			return nil
		case opWrite:
			if i.nexus != 0 && !s.registered(i.nexus) {
				if o.unknown {
					return []any{s} // it cannot have happened now
				}
				return nil // acknowledged while not registered
			}
			n := s
			if i.durable {
				n.cur, n.durable, n.vol = i.value, i.value, ""
			} else {
				n = withVolatile(s, i.value)
				n.cur = i.value
			}
			return maybe(n)
		case opSync:
			n := s
			n.durable, n.vol = s.cur, ""
			return []any{n}
		case opCrash:
			var next []any
			for _, v := range append([]uint64{s.durable}, s.volatile()...) {
				n := s
				n.cur, n.durable, n.vol = v, v, ""
				next = append(next, n)
			}
			return next
		case opPreempt:
			n := s
			for nx, c := range owner {
				if c == i.victim && n.registered(nx) {
					n = n.withRegistration(nx, false)
				}
			}
			return maybe(n)
		case opRegister:
			return maybe(s.withRegistration(i.nexus, true))
		}
		return nil
	}
	return m
}

// modelDescriptions is how the checker's messages and visualization
// name operations and states.
var modelDescriptions = porcupine.NondeterministicModel{
	DescribeOperation: func(in, out any) string {
		i := in.(input)
		switch i.kind {
		case opRead:
			if o := out.(output); o.mask != 0 {
				return fmt.Sprintf("read b%d -> %x (bytes %x of it)", i.block, o.value, o.mask)
			}
			return fmt.Sprintf("read b%d -> %x", i.block, out.(output).value)
		case opWrite:
			switch {
			case i.fua:
				return fmt.Sprintf("write b%d %x FUA", i.block, i.value)
			case i.durable:
				return fmt.Sprintf("write b%d %x (write-through)", i.block, i.value)
			}
			return fmt.Sprintf("write b%d %x", i.block, i.value)
		case opSync:
			return "sync cache"
		case opPreempt:
			return fmt.Sprintf("preempt and abort client %d", i.victim)
		case opRegister:
			return fmt.Sprintf("register on nexus %d", i.nexus)
		default:
			return "crash"
		}
	},
	DescribeState: func(st any) string {
		s := st.(regState)
		return fmt.Sprintf("%x (durable %x, volatile [%s])", s.cur, s.durable, s.vol)
	},
}

// partition cuts the history per block; crashes and flushes go into
// every part.
func partition(h []porcupine.Operation) [][]porcupine.Operation {
	var global []porcupine.Operation
	per := map[int][]porcupine.Operation{}
	for _, op := range h {
		i := op.Input.(input)
		if i.kind == opSync || i.kind == opCrash || i.kind == opPreempt || i.kind == opRegister {
			global = append(global, op)
			continue
		}
		per[i.block] = append(per[i.block], op)
	}
	blocks := make([]int, 0, len(per))
	for b := range per {
		blocks = append(blocks, b)
	}
	slices.Sort(blocks)
	out := make([][]porcupine.Operation, 0, len(blocks))
	for _, b := range blocks {
		out = append(out, append(slices.Clone(per[b]), global...))
	}
	return out
}
