package main

import (
	"errors"
	"flag"
	"io"
	"testing"
)

// seenFlag records, once every flag is read, what a later flag said.
type seenFlag struct {
	v     string
	other *bool
	got   bool
	fail  bool
}

func (s *seenFlag) String() string { return "" }
func (s *seenFlag) Set(v string) error {
	s.v = v
	return nil
}
func (s *seenFlag) afterParse() error {
	s.got = *s.other
	if s.fail {
		return errors.New("no such device")
	}
	return nil
}

// TestParseActsAfterEveryFlag: a flag that acts on another (as
// --rdma-device on --rdma-windows) sees it whatever their order, also
// when flags follow the positional arguments; its error is parse's.
func TestParseActsAfterEveryFlag(t *testing.T) {
	for _, args := range [][]string{
		{"--dev", "rxe0", "--windows", "URL"},
		{"--windows", "--dev", "rxe0", "URL"},
		{"URL", "--dev", "rxe0", "--windows"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		dev := &seenFlag{}
		fs.Var(dev, "dev", "")
		dev.other = fs.Bool("windows", false, "")
		pos, err := parse(fs, args)
		if err != nil || len(pos) != 1 || pos[0] != "URL" || dev.v != "rxe0" || !dev.got {
			t.Errorf("%q: positionals %q, %v; the device flag saw windows %v", args, pos, err, dev.got)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dev := &seenFlag{fail: true}
	fs.Var(dev, "dev", "")
	dev.other = fs.Bool("windows", false, "")
	if _, err := parse(fs, []string{"--dev", "x", "URL"}); err == nil {
		t.Error("a failing device flag parsed")
	}
	if _, err := parse(flag.NewFlagSet("u", flag.ContinueOnError), []string{"URL"}); err != nil {
		t.Error(err)
	}
}
