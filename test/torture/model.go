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
//     the block held while it ran.
//
// A write that ended in an error may or may not have happened: it takes
// effect at some point after its call, or never (its return is the end
// of time). Reads and flushes that failed are left out (they say
// nothing). Crashes and flushes concern every block: the history is cut
// per block with a copy of each in every part.

// opKind is what an operation does.
type opKind uint8

const (
	opRead opKind = iota
	opWrite
	opSync  // SYNCHRONIZE CACHE, acknowledged
	opCrash // the target lost power and came back
)

// input is an operation's input.
type input struct {
	kind  opKind
	block int
	value uint64 // written
	fua   bool
}

// output is an operation's result: the value a read returned.
type output struct {
	value uint64
}

// regState is one block's state. vol lists the values written since the
// last durable one (sorted, no repeats), as a string so states compare.
type regState struct {
	cur, durable uint64
	vol          string
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

// blockModel is the model the checker runs (per block; see partition).
var blockModel = porcupine.NondeterministicModel{
	Partition: partition,
	Init:      func() []any { return []any{regState{}} },
	Step: func(st, in, out any) []any {
		s, i := st.(regState), in.(input)
		switch i.kind {
		case opRead:
			if out.(output).value == s.cur {
				return []any{s}
			}
			return nil
		case opWrite:
			if i.fua {
				return []any{regState{cur: i.value, durable: i.value}}
			}
			n := withVolatile(s, i.value)
			n.cur = i.value
			return []any{n}
		case opSync:
			return []any{regState{cur: s.cur, durable: s.cur}}
		case opCrash:
			next := []any{regState{cur: s.durable, durable: s.durable}}
			for _, v := range s.volatile() {
				next = append(next, regState{cur: v, durable: v})
			}
			return next
		}
		return nil
	},
	DescribeOperation: func(in, out any) string {
		i := in.(input)
		switch i.kind {
		case opRead:
			return fmt.Sprintf("read b%d -> %x", i.block, out.(output).value)
		case opWrite:
			if i.fua {
				return fmt.Sprintf("write b%d %x FUA", i.block, i.value)
			}
			return fmt.Sprintf("write b%d %x", i.block, i.value)
		case opSync:
			return "sync cache"
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
		if i.kind == opSync || i.kind == opCrash {
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
