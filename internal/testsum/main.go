// Command testsum runs go test and says at the end, in one line, what it
// skipped and why: the README's test command.
//
//	go run ./internal/testsum -race -short ./...
//
// Its arguments go to go test, which it runs with -json (test2json's
// events, cmd/test2json). It prints what plain go test prints — a line a
// package, and the whole output of a test or package that failed — then
// the counts of tests passed, failed and skipped, the skipped grouped by
// the reason their t.Skip gave, and exits as go test did.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
)

func main() {
	cmd := exec.Command("go", append([]string{"test", "-json"}, os.Args[1:]...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
	s := newSummary(os.Stdout)
	if err := s.read(out); err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
	}
	err = cmd.Wait()
	fmt.Println(s.line())
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.ExitCode())
	case err != nil:
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
}

// event is one of test2json's (go doc cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Output     string
}

// summary follows the events of one go test run.
type summary struct {
	w                     io.Writer
	output                map[string][]string // by package and test ("" for the package's own)
	passed, failed        int
	skips                 map[string]int // by reason
	failedPkgs, buildFail int
}

func newSummary(w io.Writer) *summary {
	return &summary{w: w, output: map[string][]string{}, skips: map[string]int{}}
}

func (s *summary) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Fprintln(s.w, sc.Text()) // not an event: pass it on
			continue
		}
		s.event(e)
	}
	return sc.Err()
}

func (s *summary) event(e event) {
	key := e.Package + "\x00" + e.Test
	switch e.Action {
	case "build-output":
		fmt.Fprint(s.w, e.Output)
	case "build-fail":
		s.buildFail++
	case "output":
		s.output[key] = append(s.output[key], e.Output)
	case "pass", "fail", "skip":
		if e.Test == "" {
			s.packageDone(e)
			return
		}
		switch e.Action {
		case "pass":
			s.passed++
		case "fail":
			s.failed++
			// Printed with the package's, which fails too.
			s.output[e.Package+"\x00"] = append(s.output[e.Package+"\x00"], s.output[key]...)
		case "skip":
			s.skips[skipReason(s.output[key])]++
		}
		delete(s.output, key)
	}
}

// packageDone prints what go test prints for a package: its last line
// ("ok", "?" — no test files) when it passed, all its output when not.
func (s *summary) packageDone(e event) {
	key := e.Package + "\x00"
	lines := s.output[key]
	delete(s.output, key)
	if e.Action == "fail" {
		s.failedPkgs++
		fmt.Fprint(s.w, strings.Join(lines, ""))
		return
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if l := lines[i]; strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "? ") {
			fmt.Fprint(s.w, l)
			return
		}
	}
}

// skipPrefix is what testing writes before a skip's message: the file
// and line of the call.
var skipPrefix = regexp.MustCompile(`^\s+\S+\.go:\d+: `)

// skipReason is the first line of a skipped test's message.
func skipReason(lines []string) string {
	for _, l := range lines {
		if m := skipPrefix.FindString(l); m != "" {
			return strings.TrimSpace(l[len(m):])
		}
	}
	return "(no reason given)"
}

// line is the summary: counts, then the skips by reason, the most
// frequent first.
func (s *summary) line() string {
	skipped := 0
	for _, n := range s.skips {
		skipped += n
	}
	var b strings.Builder
	fmt.Fprintf(&b, "testsum: %d tests passed, %d failed, %d skipped", s.passed, s.failed, skipped)
	if s.failedPkgs+s.buildFail > 0 {
		fmt.Fprintf(&b, " (%d packages failed, %d did not build)", s.failedPkgs, s.buildFail)
	}
	reasons := slices.SortedFunc(maps.Keys(s.skips), func(a, b string) int {
		return cmp.Or(cmp.Compare(s.skips[b], s.skips[a]), cmp.Compare(a, b))
	})
	for i, r := range reasons {
		sep := "; "
		if i == 0 {
			sep = " — "
		}
		fmt.Fprintf(&b, "%s%d× %s", sep, s.skips[r], r)
	}
	return b.String()
}
