package serial

import "testing"

func TestLessThan(t *testing.T) {
	cases := []struct {
		a, b uint32
		want bool
	}{
		{0, 1, true},
		{1, 0, false},
		{0xffffffff, 0, true}, // wraparound
		{0, 0xffffffff, false},
		{5, 5, false},
		{0, 1 << 31, false}, // incomparable
		{1 << 31, 0, false},
		{0, 1<<31 - 1, true},
	}
	for _, c := range cases {
		if got := LessThan(c.a, c.b); got != c.want {
			t.Errorf("LessThan(%#x, %#x) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestInWindow(t *testing.T) {
	if !InWindow(0xfffffffe, 0xfffffff0, 5) {
		t.Error("wrapped window should contain 0xfffffffe")
	}
	if !InWindow(3, 0xfffffff0, 5) {
		t.Error("wrapped window should contain 3")
	}
	if InWindow(6, 0xfffffff0, 5) {
		t.Error("6 lies past MaxCmdSN 5")
	}
	if InWindow(0xffffffe0, 0xfffffff0, 5) {
		t.Error("0xffffffe0 lies before ExpCmdSN")
	}
}
