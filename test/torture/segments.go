package main

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Checking a long history stretch by stretch.
//
// porcupine's search keeps, for every state it reaches, the set of
// operations linearized so far: memory grows with the square of a
// partition's length, and a block's history over 30 minutes (hundreds of
// thousands of operations, with every flush and crash copied in) outgrew
// 24 GiB. So when crashes end every operation of the target — power lost
// under the in-process target, SIGKILL of the only target process — each
// block's history is cut at the crashes that no operation of the block
// and no flush overlaps, and the stretches between cuts are checked one
// after another, each starting from the states the one before can end
// in. That is exact, not an approximation:
//
//   - an operation that failed (unknown: it may have happened) cannot
//     take effect after the first crash that begins after the client saw
//     it fail: the crash ends the incarnation that held it (the
//     in-process disk refuses every view of before, volatile.go; a
//     SIGKILLed process writes nothing more), and the initiator does not
//     send a command again once it reported it failed. Its return is
//     moved there (just before that crash returns), so it no longer spans
//     the rest of the history;
//   - after a crash a block's state is (v, durable v, nothing volatile)
//     for some v. Which v are possible is found by endStates, a search
//     of every linearization of the stretch (below); porcupine checks
//     the stretch too, and says why when it breaks the model;
//   - a SYNCHRONIZE CACHE followed by another, with no crash that can
//     fall between them, changes nothing a crash can observe (the second
//     sets the durable value anew and empties the volatile ones), and
//     flushes after the last crash change nothing observable at all:
//     both are left out, which keeps thousands of flushes from being
//     copied into every block's stretches.
//
// With reservations (no crashes) or gateways (a crash ends one of them
// only) the history is checked whole, as before.

// stretchStats says how a history was checked.
type stretchStats struct {
	Blocks, Stretches, Largest, States int
	Fault                              string // the checker's own, if any
}

func (s stretchStats) String() string {
	if s.Stretches == 0 {
		return "checked whole"
	}
	t := fmt.Sprintf("checked in %d stretches of %d blocks cut at crashes (largest %d operations; at most %d states possible after a crash)",
		s.Stretches, s.Blocks, s.Largest, s.States)
	if s.Fault != "" {
		t += "; the checker failed: " + s.Fault
	}
	return t
}

// stretchFailure is the stretch of one block where the history breaks
// the model, with the states it starts from.
type stretchFailure struct {
	block int
	init  []regState
	ops   []porcupine.Operation
}

// checkStretches checks h stretch by stretch; ok is false when h cannot
// be cut (no crash, or reservations in play): check it whole then.
func checkStretches(model porcupine.NondeterministicModel, h []porcupine.Operation, timeout time.Duration) (res porcupine.CheckResult, fail *stretchFailure, st stretchStats, ok bool) {
	var crashes, syncs []porcupine.Operation
	per := map[int][]porcupine.Operation{}
	for _, op := range h {
		switch i := op.Input.(input); i.kind {
		case opCrash:
			crashes = append(crashes, op)
		case opSync:
			syncs = append(syncs, op)
		case opRead, opWrite:
			per[i.block] = append(per[i.block], op)
		default:
			return porcupine.Unknown, nil, st, false
		}
	}
	if len(crashes) == 0 {
		return porcupine.Unknown, nil, st, false
	}
	byCall := func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) }
	slices.SortFunc(crashes, byCall)
	syncs = fewerSyncs(syncs, crashes)
	blocks := make([]int, 0, len(per))
	for b, ops := range per {
		for k := range ops {
			ops[k] = boundByCrash(ops[k], crashes)
		}
		slices.SortFunc(ops, byCall)
		blocks = append(blocks, b)
	}
	slices.Sort(blocks)
	st.Blocks = len(blocks)

	single := model
	single.Partition = nil
	type result struct {
		res  porcupine.CheckResult
		fail *stretchFailure
		st   stretchStats
	}
	results := make([]result, len(blocks))
	work := make(chan int)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range work {
				r := &results[k]
				r.res, r.fail, r.st = checkBlock(single, blocks[k], per[blocks[k]], crashes, syncs, timeout)
			}
		}()
	}
	for k := range blocks {
		work <- k
	}
	close(work)
	wg.Wait()
	res = porcupine.Ok
	for _, r := range results {
		st.Stretches += r.st.Stretches
		st.States = max(st.States, r.st.States)
		st.Largest = max(st.Largest, r.st.Largest)
		if st.Fault == "" {
			st.Fault = r.st.Fault
		}
		if r.res == porcupine.Illegal && res != porcupine.Illegal {
			res, fail = porcupine.Illegal, r.fail
		} else if r.res == porcupine.Unknown && res == porcupine.Ok {
			res = porcupine.Unknown
		}
	}
	return res, fail, st, true
}

// boundByCrash moves the return of an operation that failed to just
// before the end of the first crash that began after its failure.
func boundByCrash(op porcupine.Operation, crashes []porcupine.Operation) porcupine.Operation {
	o, _ := op.Output.(output)
	if !o.unknown || o.failed == 0 {
		return op
	}
	k, _ := slices.BinarySearchFunc(crashes, o.failed+1, func(c porcupine.Operation, t int64) int { return cmp.Compare(c.Call, t) })
	if k < len(crashes) {
		op.Return = crashes[k].Return - 1
	}
	return op
}

// fewerSyncs leaves out the flushes a crash cannot tell from none
// (above). crashes are sorted by call.
func fewerSyncs(syncs, crashes []porcupine.Operation) []porcupine.Operation {
	if len(syncs) == 0 {
		return nil
	}
	slices.SortFunc(syncs, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	// next[k]: the earliest return among flushes k.. (by call).
	next := make([]int64, len(syncs)+1)
	next[len(syncs)] = math.MaxInt64
	for k := len(syncs) - 1; k >= 0; k-- {
		next[k] = min(syncs[k].Return, next[k+1])
	}
	lastCrash := crashes[len(crashes)-1]
	var keep []porcupine.Operation
	for _, s := range syncs {
		if s.Call > lastCrash.Return {
			continue // no crash after it: nothing observes it
		}
		// The flush that begins after s returned and returns first.
		k, _ := slices.BinarySearchFunc(syncs, s.Return+1, func(x porcupine.Operation, t int64) int { return cmp.Compare(x.Call, t) })
		if after := next[k]; after != math.MaxInt64 && !crashBetween(crashes, s.Call, after) {
			continue
		}
		keep = append(keep, s)
	}
	return keep
}

// crashBetween reports whether a crash overlaps the interval [from, to].
func crashBetween(crashes []porcupine.Operation, from, to int64) bool {
	// The first crash returning at or after from (crashes do not
	// overlap each other, so returns are sorted as calls are).
	k, _ := slices.BinarySearchFunc(crashes, from, func(c porcupine.Operation, t int64) int { return cmp.Compare(c.Return, t) })
	return k < len(crashes) && crashes[k].Call <= to
}

// checkBlock checks one block's history (sorted by call) stretch by
// stretch.
func checkBlock(model porcupine.NondeterministicModel, block int, ops, crashes, syncs []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, *stretchFailure, stretchStats) {
	var st stretchStats
	// maxRet[k]: the latest return among ops[:k+1]; the same for syncs.
	prefixMax := func(ops []porcupine.Operation) []int64 {
		m := make([]int64, len(ops))
		for k, op := range ops {
			m[k] = op.Return
			if k > 0 {
				m[k] = max(m[k], m[k-1])
			}
		}
		return m
	}
	opsMax, syncsMax := prefixMax(ops), prefixMax(syncs)
	overlaps := func(ops []porcupine.Operation, m []int64, c porcupine.Operation) bool {
		k, _ := slices.BinarySearchFunc(ops, c.Return+1, func(op porcupine.Operation, t int64) int { return cmp.Compare(op.Call, t) })
		return k > 0 && m[k-1] >= c.Call
	}
	// between returns what of ops (sorted by call) is called in (lo, hi).
	between := func(ops []porcupine.Operation, lo, hi int64) []porcupine.Operation {
		a, _ := slices.BinarySearchFunc(ops, lo+1, func(op porcupine.Operation, t int64) int { return cmp.Compare(op.Call, t) })
		b, _ := slices.BinarySearchFunc(ops, hi, func(op porcupine.Operation, t int64) int { return cmp.Compare(op.Call, t) })
		return ops[a:b]
	}
	init := []regState{{}}
	lo := int64(math.MinInt64)
	check := func(stretch []porcupine.Operation, from []regState) porcupine.CheckResult {
		m := model
		m.Init = func() []any {
			out := make([]any, len(from))
			for k, s := range from {
				out[k] = s
			}
			return out
		}
		return porcupine.CheckOperationsTimeout(m.ToModel(), stretch, timeout)
	}
	stretch := func(hi int64) []porcupine.Operation {
		s := slices.Clone(between(ops, lo, hi))
		s = append(s, between(syncs, lo, hi)...)
		return append(s, between(crashes, lo, hi)...)
	}
	for _, c := range crashes {
		if c.Call <= lo || overlaps(ops, opsMax, c) || overlaps(syncs, syncsMax, c) {
			continue
		}
		s := append(stretch(c.Call), c)
		st.Stretches++
		st.Largest = max(st.Largest, len(s))
		switch r := check(s, init); r {
		case porcupine.Illegal:
			return r, &stretchFailure{block, init, s}, st
		case porcupine.Unknown:
			return r, nil, st
		}
		next, err := endStates(model.Step, s, init, stateBudget)
		st.States = max(st.States, len(next))
		if err != nil {
			st.Fault = fmt.Sprintf("block %d, the crash at %v: %v", block, time.Duration(c.Call), err)
			return porcupine.Unknown, nil, st
		}
		if len(next) == 0 {
			// porcupine found the stretch legal, so it ends in some
			// state: not finding one is a fault of this checker.
			st.Fault = fmt.Sprintf("block %d: no state found after the crash at %v", block, time.Duration(c.Call))
			return porcupine.Unknown, nil, st
		}
		init, lo = next, c.Return
	}
	s := stretch(math.MaxInt64)
	st.Stretches++
	st.Largest = max(st.Largest, len(s))
	r := check(s, init)
	if r == porcupine.Illegal {
		return r, &stretchFailure{block, init, s}, st
	}
	return r, nil, st
}

// stateBudget bounds the search of endStates: the (position, state)
// pairs it remembers, about 100 bytes each.
const stateBudget = 4 << 20

// endStates returns every state the block can be in after all of ops
// (the latest called is a crash), starting from any of init: an
// exhaustive search of the linearizations, as porcupine's, but one that
// collects the states at the end instead of stopping at the first. A
// linearization is a path of steps; it may take next any operation
// called no later than the earliest return among those not yet taken.
// Where it is is said by top (every operation from top on is still to
// take) and holes (those below top still to take: they overlap
// ops[top-1], so there are few); a (position, state) pair seen before is
// not explored again, which bounds the search by the positions times the
// states, not by the paths.
func endStates(step func(st, in, out any) []any, ops []porcupine.Operation, init []regState, budget int) ([]regState, error) {
	ops = slices.SortedFunc(slices.Values(ops), func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	n := len(ops)
	// sufMin[k]: the earliest return among ops[k:].
	sufMin := make([]int64, n+1)
	sufMin[n] = math.MaxInt64
	for k := n - 1; k >= 0; k-- {
		sufMin[k] = min(ops[k].Return, sufMin[k+1])
	}
	type key struct {
		pos string
		st  regState
	}
	seen := map[key]struct{}{}
	ends := map[regState]struct{}{}
	var buf []byte
	var exceeded bool
	var visit func(top int, holes []int, st regState)
	visit = func(top int, holes []int, st regState) {
		if exceeded {
			return
		}
		if top == n && len(holes) == 0 {
			ends[st] = struct{}{}
			return
		}
		buf = binary.AppendUvarint(buf[:0], uint64(top))
		for _, h := range holes {
			buf = binary.AppendUvarint(buf, uint64(h))
		}
		k := key{string(buf), st}
		if _, ok := seen[k]; ok {
			return
		}
		if len(seen) >= budget {
			exceeded = true
			return
		}
		seen[k] = struct{}{}
		limit := sufMin[top]
		for _, h := range holes {
			limit = min(limit, ops[h].Return)
		}
		take := func(j int, top int, holes []int) {
			for _, next := range step(st, ops[j].Input, ops[j].Output) {
				visit(top, holes, next.(regState))
			}
		}
		for x, h := range holes {
			rest := append(slices.Clone(holes[:x]), holes[x+1:]...)
			take(h, top, rest)
		}
		for j := top; j < n && ops[j].Call <= limit; j++ {
			more := slices.Clone(holes)
			for k := top; k < j; k++ {
				more = append(more, k)
			}
			take(j, j+1, more)
		}
	}
	for _, st := range init {
		visit(0, nil, st)
	}
	if exceeded {
		return nil, fmt.Errorf("more than %d positions and states to search", budget)
	}
	out := make([]regState, 0, len(ends))
	for st := range ends {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b regState) int { return cmp.Compare(a.cur, b.cur) })
	return out, nil
}
