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
// 24 GiB. So each block's history is cut at quiescent moments — none of
// its operations, no flush and no crash in progress — and the stretches
// between cuts are checked one after another, each starting from the
// states the one before can end in. That is exact, not an approximation:
//
//   - every operation of a stretch is linearized before the cut and every
//     later one after it, so the history is linearizable if and only if
//     some chain of the stretches' linearizations is;
//   - which states a stretch can end in is found by endStates, a search
//     of every linearization of the stretch (below); porcupine checks the
//     stretch too, and says why when it breaks the model;
//   - an operation that failed (unknown: it may have happened) would span
//     the rest of the history and leave nothing to cut. But it cannot take
//     effect once nothing of it remains anywhere: on each target its
//     session reached (the gateways it failed over to), after the end of
//     that target's first crash that began after the client saw it fail
//     (the in-process disk refuses every view of before, volatile.go; a
//     SIGKILLed process writes nothing more), or after the client's next
//     login there completed: the client logs in with its one ISID, and a
//     target ends a session it reinstates — its tasks aborted or finished
//     — before it answers (RFC 7143 §6.3.5); over NVMe/TCP, where a new
//     controller does not end the old one's commands, once the quiesce
//     time it carries has passed since it failed (the target ends a lost
//     controller's commands within its keep-alive timeout). The initiator
//     does not send a command again once it reported it failed. Its return is moved to
//     the latest of those moments over the targets (bound), so a history
//     where a target lets an old session's write land after that fails
//     the check: the property is checked, not assumed;
//   - flushes and write durability matter only to a crash that follows:
//     a SYNCHRONIZE CACHE followed by another with no crash that can fall
//     between them, and every flush after the last crash, are left out
//     (which keeps thousands of flushes from being copied into every
//     block's stretches), and writes called after the last crash count as
//     durable at once (which keeps the states a cut carries to one value
//     each instead of a list of every value written since).
//
// With reservations the blocks share the registrations: such a history
// is checked whole, as before.

// cutting is how checkStretches cuts a history.
type cutting struct {
	// logins are each client's logins that completed, in order.
	logins map[int][]login
	// every is how many operations of its block a stretch has at least
	// before it is cut at the next quiescent moment (cutEvery).
	every int
	// timeout bounds porcupine's check of each stretch.
	timeout time.Duration
}

// cutEvery is cutting.every for the runs: porcupine's memory for a
// stretch of a few hundred operations is small, and the states carried
// across a cut are few.
const cutEvery = 256

// stretchStats says how a history was checked.
type stretchStats struct {
	Blocks, Stretches, Largest, States int
	Bounded, Unbounded                 int    // failed operations bounded by a crash, a login or the keep-alive timeout, and not
	Fault                              string // the checker's own, if any
}

func (s stretchStats) String() string {
	if s.Stretches == 0 {
		return "checked whole"
	}
	t := fmt.Sprintf("checked in %d stretches of %d blocks cut at quiescent moments (largest %d operations; at most %d states carried across a cut; %d failed operations bounded (by their status, a crash, a login or the keep-alive timeout), %d not)",
		s.Stretches, s.Blocks, s.Largest, s.States, s.Bounded, s.Unbounded)
	if s.Fault != "" {
		t += "; the checker failed: " + s.Fault
	}
	return t
}

// stretchFailure is the stretch of one block where the history breaks
// the model, with the states it starts from.
type stretchFailure struct {
	block  int
	init   []regState
	ops    []porcupine.Operation
	before []porcupine.Operation // the stretch before, sorted by call (nil: none)
}

// checkStretches checks h stretch by stretch; ok is false when h cannot
// be cut (reservations in play): check it whole then.
func checkStretches(model porcupine.NondeterministicModel, h []porcupine.Operation, cut cutting) (res porcupine.CheckResult, fail *stretchFailure, st stretchStats, ok bool) {
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
	if cut.every < 1 {
		cut.every = cutEvery
	}
	slices.SortFunc(crashes, byCall)
	syncs = fewerSyncs(syncs, crashes)
	lastCrash := int64(math.MinInt64)
	if len(crashes) > 0 {
		lastCrash = crashes[len(crashes)-1].Return
	}
	blocks := make([]int, 0, len(per))
	for b, ops := range per {
		for k, op := range ops {
			if o, _ := op.Output.(output); o.unknown {
				op = cut.bound(op, crashes)
				if op.Return == math.MaxInt64 {
					st.Unbounded++
				} else {
					st.Bounded++
				}
			}
			if i := op.Input.(input); i.kind == opWrite && op.Call > lastCrash {
				i.durable = true // no crash can tell (above)
				op.Input = i
			}
			ops[k] = op
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
				r.res, r.fail, r.st = checkBlock(single, blocks[k], per[blocks[k]], crashes, syncs, cut)
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

// bound moves the return of an operation that failed to the moment by
// which nothing of it can remain (above): for each target its session
// reached, the end of that target's first crash that began after the
// failure or the completion of the client's next login there, whichever
// comes first (just before it); the latest of those over the targets.
// With no such moment for one of them it is left as it is. crashes are
// sorted by call.
func (c cutting) bound(op porcupine.Operation, crashes []porcupine.Operation) porcupine.Operation {
	o, _ := op.Output.(output)
	if !o.unknown || o.failed == 0 || o.via == 0 {
		return op
	}
	first, _ := slices.BinarySearchFunc(crashes, o.failed+1, func(c porcupine.Operation, t int64) int { return cmp.Compare(c.Call, t) })
	end := int64(math.MinInt64)
	for g := range 64 {
		if o.via&(1<<g) == 0 {
			continue
		}
		t := int64(math.MaxInt64)
		for _, cr := range crashes[first:] {
			if cr.Input.(input).victim == g {
				t = cr.Return - 1
				break
			}
		}
		for _, l := range c.logins[op.ClientId] {
			if l.target == g && l.call > o.failed {
				t = min(t, l.ret-1)
				break
			}
		}
		if o.quiesce > 0 {
			t = min(t, o.failed+o.quiesce)
		}
		end = max(end, t)
	}
	if end != math.MaxInt64 {
		op.Return = end
	}
	return op
}

// fewerSyncs leaves out the flushes a crash cannot tell from none
// (above). crashes are sorted by call.
func fewerSyncs(syncs, crashes []porcupine.Operation) []porcupine.Operation {
	if len(syncs) == 0 || len(crashes) == 0 {
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
// stretch: a stretch ends at the first quiescent moment — the call of an
// operation of the block that begins after every earlier one returned,
// with no flush and no crash in progress — once it has cut.every
// operations of the block.
func checkBlock(model porcupine.NondeterministicModel, block int, ops, crashes, syncs []porcupine.Operation, cut cutting) (porcupine.CheckResult, *stretchFailure, stretchStats) {
	var st stretchStats
	// spans reports whether one of xs (sorted by call, m the running
	// maximum of their returns) is in progress at t: called before it,
	// returning at or after it.
	prefixMax := func(xs []porcupine.Operation) []int64 {
		m := make([]int64, len(xs))
		for k, x := range xs {
			m[k] = x.Return
			if k > 0 {
				m[k] = max(m[k], m[k-1])
			}
		}
		return m
	}
	crashesMax, syncsMax := prefixMax(crashes), prefixMax(syncs)
	spans := func(xs []porcupine.Operation, m []int64, t int64) bool {
		k, _ := slices.BinarySearchFunc(xs, t, func(x porcupine.Operation, t int64) int { return cmp.Compare(x.Call, t) })
		return k > 0 && m[k-1] >= t
	}
	// between returns what of xs (sorted by call) is called in [lo, hi).
	between := func(xs []porcupine.Operation, lo, hi int64) []porcupine.Operation {
		a, _ := slices.BinarySearchFunc(xs, lo, func(x porcupine.Operation, t int64) int { return cmp.Compare(x.Call, t) })
		b, _ := slices.BinarySearchFunc(xs, hi, func(x porcupine.Operation, t int64) int { return cmp.Compare(x.Call, t) })
		return xs[a:b]
	}
	check := func(stretch []porcupine.Operation, from []regState) porcupine.CheckResult {
		m := model
		m.Init = func() []any {
			out := make([]any, len(from))
			for k, s := range from {
				out[k] = s
			}
			return out
		}
		return porcupine.CheckOperationsTimeout(m.ToModel(), stretch, cut.timeout)
	}
	init := []regState{{}}
	first, lo := 0, int64(math.MinInt64) // the stretch: ops[first:], and what is called from lo
	var before []porcupine.Operation     // the stretch before
	stretch := func(k int, hi int64) []porcupine.Operation {
		s := slices.Clone(ops[first:k])
		s = append(s, between(syncs, lo, hi)...)
		return append(s, between(crashes, lo, hi)...)
	}
	latest := int64(math.MinInt64) // the latest return among ops[first:k]
	for k, op := range ops {
		if t := op.Call; k-first >= cut.every && latest < t && !spans(crashes, crashesMax, t) && !spans(syncs, syncsMax, t) {
			s := stretch(k, t)
			st.Stretches++
			st.Largest = max(st.Largest, len(s))
			switch r := check(s, init); r {
			case porcupine.Illegal:
				return r, &stretchFailure{block, init, s, before}, st
			case porcupine.Unknown:
				return r, nil, st
			}
			next, err := endStates(model.Step, s, init, stateBudget)
			st.States = max(st.States, len(next))
			if err != nil {
				st.Fault = fmt.Sprintf("block %d, the cut at %v: %v", block, time.Duration(t), err)
				return porcupine.Unknown, nil, st
			}
			if len(next) == 0 {
				// porcupine found the stretch legal, so it ends in some
				// state: not finding one is a fault of this checker.
				st.Fault = fmt.Sprintf("block %d: no state found at the cut at %v", block, time.Duration(t))
				return porcupine.Unknown, nil, st
			}
			slices.SortFunc(s, byCall)
			init, first, lo, latest, before = next, k, t, math.MinInt64, s
		}
		latest = max(latest, op.Return)
	}
	s := stretch(len(ops), math.MaxInt64)
	st.Stretches++
	st.Largest = max(st.Largest, len(s))
	r := check(s, init)
	if r == porcupine.Illegal {
		return r, &stretchFailure{block, init, s, before}, st
	}
	return r, nil, st
}

// stateBudget bounds the search of endStates: the (position, state)
// pairs it remembers, about 100 bytes each.
const stateBudget = 4 << 20

// endStates returns every state the block can be in after all of ops,
// starting from any of init: an
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
