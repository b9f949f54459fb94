package node

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/internal/atomicfile"
)

// The node's state (docs/operations.md, "What a node serves"): the
// configuration file is what the operator writes, and blockwire never
// rewrites it. Every change made with the administration API is recorded
// in the node's state file before it takes effect: what the node serves
// (Running) and the configuration file as it was last applied (Base). A
// reload, and a start, apply the changes the file made since Base to
// Running — a three-way merge, as version control merges — so what an
// operator changed live stays unless the file changes the same thing.

// state is the state file's content.
type state struct {
	// Base is the configuration file as it was last applied.
	Base *config.Config `toml:"base"`
	// Running is what the node serves: Base with the administration
	// API's changes.
	Running *config.Config `toml:"running"`
}

// DefaultStateFile is where a node started with configFile keeps its
// state when not told otherwise: beside it, NAME.state.toml.
func DefaultStateFile(configFile string) string {
	if configFile == "" {
		return ""
	}
	return strings.TrimSuffix(configFile, ".toml") + ".state.toml"
}

// loadState reads a state file; a missing one is (nil, nil).
func loadState(path string) (*state, error) {
	var st state
	_, err := toml.DecodeFile(path, &st)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the node's state %s: %w", path, err)
	}
	if st.Base == nil || st.Running == nil {
		return nil, fmt.Errorf("the node's state %s: no [base] or [running]", path)
	}
	return &st, nil
}

// storeState writes the state file: a new file, synced, renamed into
// place, the directory synced; the version it replaces is kept as
// PATH.prev the same way.
func storeState(path string, st state) error {
	var b bytes.Buffer
	b.WriteString("# blockwire's state: what this node serves (running) and its configuration\n" +
		"# file as last applied (base). Written by blockwire at every change; do not edit.\n" +
		"# Change the configuration file, or use blockwire admin (docs/operations.md).\n")
	if err := toml.NewEncoder(&b).Encode(st); err != nil {
		return err
	}
	if old, err := os.ReadFile(path); err == nil {
		if bytes.Equal(old, b.Bytes()) {
			return nil
		}
		if err := atomicfile.WriteFile(path+".prev", old, 0o600); err != nil {
			return fmt.Errorf("keeping the previous state as %s.prev: %w", path, err)
		}
	}
	if err := atomicfile.WriteFile(path, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("recording the change in the node's state %s: %w (give serve --state a writable file)", path, err)
	}
	return nil
}

// merge applies the changes theirs (the configuration file now) made to
// base (the file as last applied) on top of ours (what runs), target by
// target and LUN by LUN: what the file did not change keeps its running
// value; what the file changed takes the file's. A change both made
// differently is a conflict, named in the result; the file's value is
// taken there (the caller refuses unless told to force). What only a
// restart changes (portals, limits, the surfaces) is merged setting by
// setting: as it runs where the file left it, else the file's.
func merge(base, ours, theirs *config.Config) (*config.Config, []string) {
	// What only a restart changes, setting by setting: what the file
	// left stays as it runs (flags given to serve among it).
	out := ours.Clone()
	mergeFields(reflect.ValueOf(base).Elem(), reflect.ValueOf(theirs.Clone()).Elem(), reflect.ValueOf(out).Elem())
	var conflicts []string
	conflictAt := func(where, what string) { conflicts = append(conflicts, where+": "+what) }
	conflict := func(where string) func(string) { return func(what string) { conflictAt(where, what) } }
	out.Discovery = pick(base.Discovery, ours.Discovery, theirs.Discovery, deepEqual, conflict("discovery"))
	out.Targets = merge3(base.Targets, ours.Targets, theirs.Targets, func(t config.Target) string { return t.Name }, equalTarget,
		func(name string) string { return "target " + name },
		func(b, o, t config.Target, inB bool, where string) config.Target {
			if !inB {
				b = config.Target{Name: t.Name} // both added it: merged against nothing
			}
			m := pick(accessOf(b), accessOf(o), accessOf(t), deepEqual, conflict(where))
			m.TPGT, m.PortGroups, m.SRPIDExt = t.TPGT, t.PortGroups, t.SRPIDExt
			m.LUNs = merge3(b.LUNs, o.LUNs, t.LUNs, func(l config.LUN) uint64 { return l.ID }, sameLUN,
				func(id uint64) string { return fmt.Sprintf("%s LUN %d", where, id) },
				func(b, o, t config.LUN, inB bool, lw string) config.LUN {
					if !inB { // both added it: the same, or a conflict
						if !sameLUN(o, t) {
							conflict(lw)("added live and in the file, differently")
						}
						return t
					}
					return pick(b, o, t, sameLUN, conflict(lw))
				}, conflictAt)
			slices.SortFunc(m.LUNs, func(x, y config.LUN) int { return cmp.Compare(x.ID, y.ID) })
			return m
		}, conflictAt)
	return out, conflicts
}

// merge3 is the three-way walk, element by element (targets by name,
// LUNs by number), in ours' order then theirs': one both sides have is
// combined by both (inB: base has it too); one a side added alone stays;
// one a side removed stays removed — unless the other side changed it,
// a conflict (the file's is kept).
func merge3[K comparable, V any](base, ours, theirs []V, key func(V) K, same func(a, b V) bool, name func(K) string,
	both func(b, o, t V, inB bool, where string) V, conflict func(where, what string)) []V {
	idx := func(vs []V) map[K]V {
		m := make(map[K]V, len(vs))
		for _, v := range vs {
			m[key(v)] = v
		}
		return m
	}
	bm, om, tm := idx(base), idx(ours), idx(theirs)
	seen := map[K]bool{}
	var out []V
	for _, v := range slices.Concat(ours, theirs) {
		k := key(v)
		if seen[k] {
			continue
		}
		seen[k] = true
		b, inB := bm[k]
		o, inO := om[k]
		t, inT := tm[k]
		switch {
		case inO && inT:
			out = append(out, both(b, o, t, inB, name(k)))
		case inO && !inB:
			out = append(out, o) // added live: stays
		case inO && !same(b, o):
			conflict(name(k), "removed from the file, but changed live")
		case inT && !inB:
			out = append(out, t) // added to the file
		case inT && !same(b, t):
			conflict(name(k), "removed live, but changed in the file")
			out = append(out, t)
		}
		// else: removed on one side, left alone on the other.
	}
	return out
}

// mergeFields sets each field of out (ours) to theirs' where theirs
// differs from base, a struct (the limits) field by field. Targets and
// discovery are merge's own.
func mergeFields(base, theirs, out reflect.Value) {
	for i := range out.NumField() {
		switch name := out.Type().Field(i).Name; {
		case name == "Targets" || name == "Discovery":
		case out.Field(i).Kind() == reflect.Struct:
			mergeFields(base.Field(i), theirs.Field(i), out.Field(i))
		case !reflect.DeepEqual(base.Field(i).Interface(), theirs.Field(i).Interface()):
			out.Field(i).Set(theirs.Field(i))
		}
	}
}

// pick is the three-way choice for one value, compared by eq.
func pick[T any](base, ours, theirs T, eq func(a, b T) bool, conflict func(string)) T {
	switch {
	case eq(theirs, base):
		return ours
	case eq(ours, base), eq(ours, theirs):
		return theirs
	}
	conflict("changed live and in the file, differently")
	return theirs
}

func deepEqual[T any](a, b T) bool { return reflect.DeepEqual(a, b) }

// sameLUN compares LUN configurations with sizes by value: "64MiB" and
// "67108864" are one size.
func sameLUN(a, b config.LUN) bool {
	if sa, sb := sizeOf(a.Size), sizeOf(b.Size); sa == sb {
		a.Size, b.Size = "", ""
	}
	return reflect.DeepEqual(a, b)
}

func sizeOf(s string) int64 {
	if s == "" {
		return 0
	}
	n, err := config.ParseSize(s)
	if err != nil {
		return -1
	}
	return n
}

func equalTarget(a, b config.Target) bool {
	if len(a.LUNs) != len(b.LUNs) || !reflect.DeepEqual(accessOf(a), accessOf(b)) ||
		a.TPGT != b.TPGT || !slices.Equal(a.PortGroups, b.PortGroups) || a.SRPIDExt != b.SRPIDExt {
		return false
	}
	for i := range a.LUNs {
		if !sameLUN(a.LUNs[i], b.LUNs[i]) {
			return false
		}
	}
	return true
}

func byName(ts []config.Target) map[string]config.Target {
	m := map[string]config.Target{}
	for _, t := range ts {
		m[t.Name] = t
	}
	return m
}

// ConfigDiff says, without a running node, what the configuration file
// would change if the node whose state is stateFile were started or
// reloaded with it now, and what of that would be refused (blockwire
// config diff). A node that has recorded no state serves the file as it
// is: ConfigDiff says so with an error.
func ConfigDiff(file, stateFile string) (changes, refused []string, err error) {
	cfg, err := config.Load(file)
	if err != nil {
		return nil, nil, err
	}
	st, err := loadState(stateFile)
	if err != nil {
		return nil, nil, err
	}
	if st == nil {
		return nil, nil, fmt.Errorf("no state at %s: a node started with %s serves it as it is", stateFile, file)
	}
	next, conflicts := merge(st.Base, st.Running, cfg)
	changes, refused = planChange(st.Running, next, Consent{}, configView{})
	for _, c := range conflicts {
		refused = append(refused, c+" (--force takes the file's; or make the file say what runs)")
	}
	return changes, refused, nil
}
