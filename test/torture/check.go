package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// check runs the checker: stretch by stretch where the history can be
// cut (segments.go), else whole. For an illegal history it finds the first failing block (or
// stretch) and the shortest prefix of it (by invocation) that already
// breaks the model, lists that prefix's last operations (flushes left
// out), and writes the checker's visualization of the prefix to artifact.
func check(model porcupine.NondeterministicModel, h []porcupine.Operation, cut cutting, artifact string) (porcupine.CheckResult, []string, stretchStats) {
	single := model
	single.Partition = nil
	if res, fail, st, ok := checkStretches(model, h, cut); ok {
		if fail == nil {
			return res, nil, st
		}
		from := make([]string, len(fail.init))
		for k, s := range fail.init {
			from[k] = fmt.Sprintf("%x", s.cur)
		}
		m := single
		m.Init = func() []any {
			out := make([]any, len(fail.init))
			for k, s := range fail.init {
				out[k] = s
			}
			return out
		}
		lines, all := explain(m, fail.ops, artifact)
		var out []string
		if all && len(fail.before) > 0 {
			// It breaks at the stretch's start: what came before.
			tail, _ := describe(single, fail.before, 8, nil)
			out = append(append(out, fmt.Sprintf("block %d, the end of the stretch before:", fail.block)), tail...)
		}
		out = append(out, fmt.Sprintf("block %d, in the stretch from %v, which starts holding one of [%s]:",
			fail.block, time.Duration(slices.MinFunc(fail.ops, byCall).Call), strings.Join(from, " ")))
		return res, append(out, lines...), st
	}
	res := porcupine.CheckOperationsTimeout(model.ToModel(), h, 10*time.Minute)
	if res != porcupine.Illegal {
		return res, nil, stretchStats{}
	}
	for _, part := range partition(h) {
		if porcupine.CheckOperationsTimeout(single.ToModel(), part, time.Minute) == porcupine.Illegal {
			block := -1
			for _, op := range part {
				if i := op.Input.(input); i.kind == opRead || i.kind == opWrite {
					block = i.block
					break
				}
			}
			lines, _ := explain(single, part, artifact)
			return res, append([]string{fmt.Sprintf("block %d, checked whole:", block)}, lines...), stretchStats{}
		}
	}
	return res, nil, stretchStats{}
}

func byCall(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) }

// explain finds the shortest prefix (by invocation) of an illegal part
// of a history that already breaks the model, lists its last operations
// — the ones without which the prefix is legal marked as where it
// breaks, each run of flushes as one line — and writes the checker's
// visualization of it to artifact. all reports whether the list reaches
// back to the part's first operation.
func explain(model porcupine.NondeterministicModel, part []porcupine.Operation, artifact string) (out []string, all bool) {
	m := model.ToModel()
	part = slices.Clone(part)
	slices.SortFunc(part, byCall)
	// upTo is the history up to the k-th call: all of part for the last.
	upTo := func(k int) []porcupine.Operation {
		if k == len(part) {
			return part
		}
		return clipped(part[:k])
	}
	lo, hi := 1, len(part)
	for lo < hi {
		mid := (lo + hi) / 2
		if porcupine.CheckOperationsTimeout(m, upTo(mid), 20*time.Second) != porcupine.Illegal {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	prefix := upTo(lo)
	var legal []porcupine.Operation
	if lo > 1 {
		legal = upTo(lo - 1)
	}
	if artifact != "" {
		_, info := porcupine.CheckOperationsVerbose(m, prefix, time.Minute)
		if err := porcupine.VisualizePath(m, info, artifact); err != nil {
			out = append(out, "visualization: "+err.Error())
		}
	}
	// Where it breaks: of the operations the last step added, those
	// without which the prefix is legal (all of them when no one alone
	// is).
	var added, breaks []porcupine.Operation
	for _, op := range prefix {
		if !slices.Contains(legal, op) {
			added = append(added, op)
		}
	}
	for k, op := range added {
		without := slices.DeleteFunc(slices.Clone(prefix), func(x porcupine.Operation) bool { return x == added[k] })
		if porcupine.CheckOperationsTimeout(m, without, 20*time.Second) == porcupine.Ok {
			breaks = append(breaks, op)
		}
	}
	if len(breaks) == 0 {
		breaks = added
	}
	lines, all := describe(model, prefix, 16, func(op porcupine.Operation) bool { return slices.Contains(breaks, op) })
	return append(out, lines...), all
}

// describe lists the last operations of ops (sorted by call), at most
// limit lines, each run of flushes as one line; breaks marks the
// operations where the model breaks. all reports whether the list
// reaches back to ops's first.
func describe(model porcupine.NondeterministicModel, ops []porcupine.Operation, limit int, breaks func(porcupine.Operation) bool) (out []string, all bool) {
	when := func(op porcupine.Operation) string {
		if op.Return == math.MaxInt64 {
			return time.Duration(op.Call).String() + " .. never returned"
		}
		return time.Duration(op.Call).String() + " .. " + time.Duration(op.Return).String()
	}
	i := len(ops) - 1
	for ; i >= 0 && len(out) < limit; i-- {
		op := ops[i]
		if op.Input.(input).kind == opSync {
			// The run of flushes ending here, as one line: a flush
			// between the last writes and a crash is never hidden.
			j := i
			for j > 0 && ops[j-1].Input.(input).kind == opSync {
				j--
			}
			line := fmt.Sprintf("%-9s %-36s  %s", "clients", fmt.Sprintf("sync cache ×%d (acknowledged)", i-j+1),
				time.Duration(ops[j].Call).String()+" .. "+time.Duration(ops[i].Return).String())
			if i == j {
				line = fmt.Sprintf("client %-2d %-36s  %s", op.ClientId, "sync cache", when(op))
			}
			out = append(out, line)
			i = j
			continue
		}
		line := fmt.Sprintf("client %-2d %-36s  %s", op.ClientId, model.DescribeOperation(op.Input, op.Output), when(op))
		if breaks != nil && breaks(op) {
			line += "   <- the history breaks the model here"
		}
		out = append(out, line)
	}
	slices.Reverse(out)
	return out, i < 0
}

// clipped is a prefix of a history whose operations returning after the
// prefix's last call are left open (they may take effect later, or not).
func clipped(p []porcupine.Operation) []porcupine.Operation {
	out := slices.Clone(p)
	last := p[len(p)-1].Call
	var keep []porcupine.Operation
	for _, op := range out {
		if op.Return > last && op.Input.(input).kind == opRead {
			continue // a read's value only counts once it returned
		}
		keep = append(keep, op)
	}
	return keep
}
