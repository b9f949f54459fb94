package main

import (
	"strings"
	"testing"
)

// TestSummary: a passing package prints its "ok" line, a failing one its
// output with the failing test's, and the last line counts the tests and
// groups the skips by reason, the most frequent first.
func TestSummary(t *testing.T) {
	events := `{"Action":"start","Package":"a"}
{"Action":"run","Package":"a","Test":"TestOK"}
{"Action":"output","Package":"a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"pass","Package":"a","Test":"TestOK"}
{"Action":"run","Package":"a","Test":"TestLong"}
{"Action":"output","Package":"a","Test":"TestLong","Output":"=== RUN   TestLong\n"}
{"Action":"output","Package":"a","Test":"TestLong","Output":"    a_test.go:12: long: a torture run\n"}
{"Action":"output","Package":"a","Test":"TestLong","Output":"--- SKIP: TestLong (0.00s)\n"}
{"Action":"skip","Package":"a","Test":"TestLong"}
{"Action":"output","Package":"a","Output":"PASS\n"}
{"Action":"output","Package":"a","Output":"ok  \ta\t0.01s\n"}
{"Action":"pass","Package":"a"}
{"Action":"run","Package":"b","Test":"TestLong2"}
{"Action":"output","Package":"b","Test":"TestLong2","Output":"    b_test.go:3: long: a torture run\n"}
{"Action":"skip","Package":"b","Test":"TestLong2"}
{"Action":"run","Package":"b","Test":"TestRoot"}
{"Action":"output","Package":"b","Test":"TestRoot","Output":"    b_test.go:9: needs root\n"}
{"Action":"skip","Package":"b","Test":"TestRoot"}
{"Action":"run","Package":"b","Test":"TestBad"}
{"Action":"output","Package":"b","Test":"TestBad","Output":"    b_test.go:20: got 2, want 3\n"}
{"Action":"output","Package":"b","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"b","Test":"TestBad"}
{"Action":"output","Package":"b","Output":"FAIL\tb\t0.02s\n"}
{"Action":"fail","Package":"b"}
{"Action":"build-output","ImportPath":"c","Output":"c/c.go:1:1: syntax error\n"}
{"Action":"build-fail","ImportPath":"c"}
{"Action":"output","Package":"d","Output":"?   \td\t[no test files]\n"}
{"Action":"skip","Package":"d"}
`
	var out strings.Builder
	s := newSummary(&out)
	if err := s.read(strings.NewReader(events)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ok  \ta\t0.01s\n", "b_test.go:20: got 2, want 3\n--- FAIL: TestBad", "FAIL\tb\t0.02s\n", "c/c.go:1:1: syntax error\n", "?   \td\t[no test files]\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "TestOK") || strings.Contains(out.String(), "needs root") {
		t.Errorf("output shows what plain go test hides:\n%s", out.String())
	}
	want := "testsum: 1 tests passed, 1 failed, 3 skipped (1 packages failed, 1 did not build) — 2× long: a torture run; 1× needs root"
	if got := s.line(); got != want {
		t.Errorf("summary\n%s\nwant\n%s", got, want)
	}
}
