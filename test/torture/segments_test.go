package main

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// simulate makes a history of clients reading, writing and flushing
// blocks of storage that follows the model, with crashes (unless
// crashFree), failed writes that land before, late (before the next crash
// and before the client's next login completes) or never, and, when bug
// is set, one read that returns a value it should not. A client logs in
// again after each failed write; logins are those logins.
func simulate(rng *rand.Rand, bug, crashFree bool) ([]porcupine.Operation, map[int][]login) {
	const clients, blocks, end = 3, 2, 1500
	type crash struct{ call, at, ret int64 }
	var crashes []crash
	// Times are tens of ticks, so that a linearization point fits
	// strictly inside every operation.
	for t := int64(20 + rng.IntN(80)); t < end && !crashFree; t += int64(30 + rng.IntN(150)) {
		crashes = append(crashes, crash{t * 10, t*10 + 5, t*10 + 30})
	}
	logins := map[int][]login{}
	// crashIn is the moment of a crash inside (a, b), or 0.
	crashIn := func(a, b int64) int64 {
		for _, c := range crashes {
			if c.at > a && c.at < b {
				return c.at
			}
		}
		return 0
	}
	nextCrash := func(t int64) int64 {
		for _, c := range crashes {
			if c.call > t {
				return c.call
			}
		}
		return end*10 + 1000
	}
	type event struct {
		at int64
		op int // index in h, or -1 - crash
	}
	var h []porcupine.Operation
	var events []event
	for cl := range clients {
		seq := uint64(0)
		for t := int64(rng.IntN(5)); t < end; {
			call, ret := t*10, (t+1+int64(rng.IntN(20)))*10
			lin := call + 1 + rng.Int64N(ret-call-1)
			op := porcupine.Operation{ClientId: cl, Call: call, Return: ret}
			next := ret/10 + int64(rng.IntN(6)) // the client's next call, in tens
			crashAt := crashIn(call, ret)
			interrupted := crashAt != 0
			switch p := rng.IntN(100); {
			case p < 45:
				seq++
				fua := rng.IntN(3) == 0
				op.Input = input{kind: opWrite, block: rng.IntN(blocks), value: uint64(cl+1)<<32 | seq, fua: fua, durable: fua}
				happens := true
				if interrupted || rng.IntN(30) == 0 {
					op.Output = output{unknown: true, failed: ret, via: 1}
					// The client logs in again; the login ends what is
					// left of the write.
					l := login{call: ret + 10, ret: ret + 10*int64(2+rng.IntN(5))}
					logins[cl] = append(logins[cl], l)
					next = l.ret/10 + 1
					switch rng.IntN(3) {
					case 0:
						happens = false
					case 1: // late, before the next crash and the login's end
						if nc := min(nextCrash(ret), l.ret-1); nc > ret+1 {
							lin = ret + 1 + rng.Int64N(nc-ret-1)
						}
					}
					if interrupted && lin > crashAt {
						happens = false // its incarnation is gone
					}
					op.Return = math.MaxInt64
				} else {
					op.Output = output{}
				}
				h = append(h, op)
				if happens {
					events = append(events, event{lin, len(h) - 1})
				}
			case p < 90:
				if interrupted {
					break // a failed read says nothing
				}
				op.Input = input{kind: opRead, block: rng.IntN(blocks)}
				h = append(h, op)
				events = append(events, event{lin, len(h) - 1})
			default:
				if interrupted {
					break
				}
				op.Input = input{kind: opSync}
				h = append(h, op)
				events = append(events, event{lin, len(h) - 1})
			}
			t = next
		}
	}
	for k, c := range crashes {
		h = append(h, porcupine.Operation{ClientId: clients, Input: input{kind: opCrash}, Call: c.call, Return: c.ret})
		events = append(events, event{c.at, -1 - k})
	}
	slices.SortStableFunc(events, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	var cur, durable [blocks]uint64
	var vol [blocks][]uint64
	var reads []int
	for _, e := range events {
		if e.op < 0 {
			for b := range blocks {
				choice := append([]uint64{durable[b]}, vol[b]...)
				v := choice[rng.IntN(len(choice))]
				cur[b], durable[b], vol[b] = v, v, nil
			}
			continue
		}
		i := h[e.op].Input.(input)
		switch i.kind {
		case opWrite:
			cur[i.block] = i.value
			if i.durable {
				durable[i.block], vol[i.block] = i.value, nil
			} else {
				vol[i.block] = append(vol[i.block], i.value)
			}
		case opSync:
			for b := range blocks {
				durable[b], vol[b] = cur[b], nil
			}
		case opRead:
			h[e.op].Output = output{value: cur[i.block]}
			reads = append(reads, e.op)
		}
	}
	if bug && len(reads) > 0 {
		r := reads[rng.IntN(len(reads))]
		var written []uint64
		for _, op := range h {
			if i := op.Input.(input); i.kind == opWrite && i.block == h[r].Input.(input).block {
				written = append(written, i.value)
			}
		}
		if len(written) > 0 {
			h[r].Output = output{value: written[rng.IntN(len(written))]}
		}
	}
	return h, logins
}

// TestStretchesAgreeWithWholeCheck: on histories small enough to check
// whole, checking them stretch by stretch gives the same verdict —
// legal or not — and histories of storage that follows the model pass;
// with crashes and without (failed writes then bounded by the client's
// next login), cut as often as can be and less often.
func TestStretchesAgreeWithWholeCheck(t *testing.T) {
	n := 400
	if testing.Short() {
		n = 100
	}
	rng := rand.New(rand.NewPCG(11, 12))
	model := newModel(nil)
	illegal, cut, free := 0, 0, 0
	for k := range n {
		bug, crashFree := k%2 == 1, k%4 >= 2
		h, logins := simulate(rng, bug, crashFree)
		c := cutting{logins: logins, every: []int{1, 7, 50}[k%3], timeout: time.Minute}
		// The whole check with the same bound on failed writes.
		var crashes []porcupine.Operation
		for _, op := range h {
			if op.Input.(input).kind == opCrash {
				crashes = append(crashes, op)
			}
		}
		slices.SortFunc(crashes, byCall)
		bounded := make([]porcupine.Operation, len(h))
		for i, op := range h {
			bounded[i] = c.bound(op, crashes)
		}
		whole := porcupine.CheckOperationsTimeout(model.ToModel(), bounded, time.Minute)
		got, fail, st, ok := checkStretches(model, h, c)
		if !ok {
			t.Fatalf("history %d: not cut", k)
		}
		if got != whole {
			t.Fatalf("history %d (bug %v, crash-free %v): stretch by stretch %v, whole %v (%s)", k, bug, crashFree, got, whole, st)
		}
		if !bug && whole != porcupine.Ok {
			t.Fatalf("history %d: storage that follows the model fails the check", k)
		}
		if st.Unbounded != 0 {
			t.Fatalf("history %d: %d failed writes not bounded", k, st.Unbounded)
		}
		if got == porcupine.Illegal {
			illegal++
			if fail == nil || len(fail.ops) == 0 {
				t.Fatalf("history %d: illegal without the failing stretch", k)
			}
		}
		if st.Stretches > 2*st.Blocks {
			cut++
			if crashFree {
				free++
			}
		}
	}
	t.Logf("%d histories, %d illegal, %d cut in more than two stretches per block (%d of them crash-free)", n, illegal, cut, free)
	if illegal < n/8 || cut < n/2 || free < n/8 {
		t.Fatalf("too few illegal (%d) or cut (%d, crash-free %d) histories of %d to mean anything", illegal, cut, free, n)
	}
}

// TestBound: a failed write is bounded by the first crash of each target
// it reached or the client's next login there, whichever ends first, and
// by the latest of those over the targets; without one for a target it
// stays open.
func TestBound(t *testing.T) {
	crash := func(call, ret int64, target int) porcupine.Operation {
		return porcupine.Operation{ClientId: 9, Input: input{kind: opCrash, victim: target}, Call: call, Return: ret}
	}
	crashes := []porcupine.Operation{crash(50, 60, 1), crash(200, 210, 0), crash(300, 310, 1)}
	c := cutting{logins: map[int][]login{
		1: {{call: 5, ret: 8, target: 0}, {call: 100, ret: 120, target: 0}},
		2: {{call: 30, ret: 40, target: 1}},
	}}
	quiesced := func(op porcupine.Operation, d int64) porcupine.Operation {
		o := op.Output.(output)
		o.quiesce = d
		op.Output = o
		return op
	}
	failed := func(client int, via uint64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: input{kind: opWrite}, Call: 10, Return: math.MaxInt64,
			Output: output{unknown: true, failed: 20, via: via}}
	}
	for _, x := range []struct {
		name string
		op   porcupine.Operation
		ret  int64
	}{
		{"target 0: the next login", failed(1, 1), 119},
		{"target 1: its crash", failed(1, 2), 59},
		{"both: the later", failed(1, 3), 119},
		{"target 0, no login: its crash", failed(2, 1), 209},
		{"target 1: the login before the crash", failed(2, 2), 39},
		{"target 2: nothing ends it", failed(1, 4), math.MaxInt64},
		{"not known where it went", failed(1, 0), math.MaxInt64},
		{"NVMe, target 2: its quiesce time", quiesced(failed(1, 4), 30), 50},
		{"NVMe, target 1: its crash, before the quiesce time", quiesced(failed(3, 2), 100), 59},
		{"NVMe, target 0: the quiesce time, before its crash", quiesced(failed(3, 1), 100), 120},
	} {
		if got := c.bound(x.op, crashes).Return; got != x.ret {
			t.Errorf("%s: return %d, want %d", x.name, got, x.ret)
		}
	}
}

// TestFewerSyncs: a flush followed by another with no crash between is
// left out, as is one after the last crash; one a crash can follow is
// kept.
func TestFewerSyncs(t *testing.T) {
	s := func(call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: input{kind: opSync}, Call: call, Return: ret}
	}
	c := func(call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: input{kind: opCrash}, Call: call, Return: ret}
	}
	got := fewerSyncs([]porcupine.Operation{s(0, 2), s(3, 4), s(5, 8), s(6, 7), s(11, 12), s(20, 21)},
		[]porcupine.Operation{c(9, 10), c(13, 14)})
	var calls []int64
	for _, op := range got {
		calls = append(calls, op.Call)
	}
	// s(0,2) and s(3,4) are followed by s(6,7) before the crash; s(5,8)
	// and s(6,7) overlap, neither follows the other: both stay; s(11,12)
	// is the last before the second crash; s(20,21) comes after the last.
	if want := []int64{5, 6, 11}; !slices.Equal(calls, want) {
		t.Fatalf("kept flushes called at %v, want %v", calls, want)
	}
}

// TestEndStates: after a crash a block holds its durable value or one
// written after it; a write that failed may count or not.
func TestEndStates(t *testing.T) {
	op := func(call, ret int64, in input, out output) porcupine.Operation {
		return porcupine.Operation{Input: in, Output: out, Call: call, Return: ret}
	}
	w := func(call, ret int64, v uint64, fua, unknown bool) porcupine.Operation {
		return op(call, ret, input{kind: opWrite, value: v, fua: fua, durable: fua}, output{unknown: unknown})
	}
	crash := op(100, 110, input{kind: opCrash}, output{})
	sync := op(40, 45, input{kind: opSync}, output{})
	model := newModel(nil)
	for _, c := range []struct {
		name string
		ops  []porcupine.Operation
		want []uint64
	}{
		{"volatile", []porcupine.Operation{w(10, 20, 1, false, false), crash}, []uint64{0, 1}},
		{"fua", []porcupine.Operation{w(10, 20, 1, true, false), crash}, []uint64{1}},
		{"flushed then failed", []porcupine.Operation{w(10, 20, 1, false, false), sync, w(50, 99, 2, true, true), crash}, []uint64{1, 2}},
		{"overlapping", []porcupine.Operation{w(10, 30, 1, true, false), w(20, 40, 2, true, false), crash}, []uint64{1, 2}},
		{"read pins the order", []porcupine.Operation{w(10, 30, 1, true, false), w(20, 40, 2, true, false),
			op(50, 60, input{kind: opRead}, output{value: 1}), crash}, []uint64{1}},
		{"impossible read", []porcupine.Operation{w(10, 20, 1, true, false), op(50, 60, input{kind: opRead}, output{value: 7}), crash}, nil},
	} {
		got, err := endStates(model.Step, c.ops, []regState{{}}, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var vals []uint64
		for _, s := range got {
			if s.durable != s.cur || s.vol != "" {
				t.Fatalf("%s: state %+v after a crash is not settled", c.name, s)
			}
			vals = append(vals, s.cur)
		}
		if !slices.Equal(vals, c.want) {
			t.Errorf("%s: after the crash the block may hold %x, want %x", c.name, vals, c.want)
		}
	}
	// The budget is a bound, and reaching it is said.
	many := []porcupine.Operation{crash}
	for k := range 12 {
		many = append(many, w(10+int64(k), 90, uint64(k+1), false, false))
	}
	if _, err := endStates(model.Step, many, []regState{{}}, 100); err == nil {
		t.Fatal("12 overlapping writes explored within 100 positions and states")
	}
}

// TestReportOfABreakAtAStretchStart: a FUA write lost in a crash shows
// in the first read after it, at the start of a stretch: the report
// names the block, shows the end of the stretch before — the write, the
// flush after it, the crash — and marks the read where the history
// breaks.
func TestReportOfABreakAtAStretchStart(t *testing.T) {
	op := func(client int, call, ret int64, in input, out any) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
	}
	h := []porcupine.Operation{
		op(0, 0, 10, input{kind: opWrite, block: 3, value: 0xa, fua: true, durable: true}, output{}),
		op(1, 12, 15, input{kind: opSync}, nil),
		op(1, 13, 16, input{kind: opSync}, nil),
		op(4, 20, 30, input{kind: opCrash}, nil),
		op(2, 40, 50, input{kind: opRead, block: 3}, output{value: 0}),
	}
	res, lines, _ := check(newModel(nil), h, cutting{every: 1, timeout: time.Minute}, "")
	if res != porcupine.Illegal {
		t.Fatalf("verdict %v", res)
	}
	report := strings.Join(lines, "\n")
	t.Logf("\n%s", report)
	for _, want := range []string{"block 3, the end of the stretch before:", "write b3 a FUA", "sync cache ×2", "crash",
		"block 3, in the stretch from", "read b3 -> 0"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	for _, l := range lines {
		if marked := strings.HasSuffix(l, "<- the history breaks the model here"); marked != strings.Contains(l, "read b3 -> 0") {
			t.Errorf("the break marked on the wrong line: %q", l)
		}
	}
}
