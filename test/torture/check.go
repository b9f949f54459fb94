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
// cut (segments.go), else whole. For an illegal history it finds the
// first failing block (or stretch) and the shortest prefix of it (by
// invocation) that already breaks the model, lists that prefix's last
// operations (flushes left out), and writes the checker's visualization
// of the prefix to artifact.
func check(model porcupine.NondeterministicModel, h []porcupine.Operation, artifact string, cut bool) (porcupine.CheckResult, []string, stretchStats) {
	single := model
	single.Partition = nil
	if cut {
		res, fail, st, ok := checkStretches(model, h, 2*time.Minute)
		if ok {
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
			out := []string{fmt.Sprintf("block %d, in the stretch from %v, which starts holding one of [%s]:",
				fail.block, time.Duration(slices.MinFunc(fail.ops, byCall).Call), strings.Join(from, " "))}
			return res, append(out, explain(m, fail.ops, artifact)...), st
		}
	}
	res := porcupine.CheckOperationsTimeout(model.ToModel(), h, 10*time.Minute)
	if res != porcupine.Illegal {
		return res, nil, stretchStats{}
	}
	for _, part := range partition(h) {
		if porcupine.CheckOperationsTimeout(single.ToModel(), part, time.Minute) == porcupine.Illegal {
			return res, explain(single, part, artifact), stretchStats{}
		}
	}
	return res, nil, stretchStats{}
}

func byCall(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) }

// explain finds the shortest prefix (by invocation) of an illegal part
// of a history that already breaks the model, lists its last operations
// (flushes left out), and writes the checker's visualization of it to
// artifact.
func explain(model porcupine.NondeterministicModel, part []porcupine.Operation, artifact string) []string {
	m := model.ToModel()
	part = slices.Clone(part)
	slices.SortFunc(part, byCall)
	lo, hi := 1, len(part)
	for lo < hi {
		mid := (lo + hi) / 2
		if porcupine.CheckOperationsTimeout(m, clipped(part[:mid]), 20*time.Second) != porcupine.Illegal {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	prefix := clipped(part[:lo])
	var out []string
	if artifact != "" {
		_, info := porcupine.CheckOperationsVerbose(m, prefix, time.Minute)
		if err := porcupine.VisualizePath(m, info, artifact); err != nil {
			out = append(out, "visualization: "+err.Error())
		}
	}
	var shown []porcupine.Operation
	syncs := 0
	for i := len(prefix) - 1; i >= 0 && len(shown) < 16; i-- {
		if prefix[i].Input.(input).kind == opSync {
			syncs++
			continue
		}
		shown = append(shown, prefix[i])
	}
	slices.Reverse(shown)
	for _, op := range shown {
		ret := "never returned"
		if op.Return != math.MaxInt64 {
			ret = time.Duration(op.Return).String()
		}
		out = append(out, fmt.Sprintf("client %d  %-30s  %v .. %s", op.ClientId,
			model.DescribeOperation(op.Input, op.Output), time.Duration(op.Call), ret))
	}
	return append(out, fmt.Sprintf("(%d acknowledged SYNCHRONIZE CACHE among them not shown)", syncs))
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
