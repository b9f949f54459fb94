package logsample

import "testing"

func TestKeep(t *testing.T) {
	var kept []int
	for n := 1; n <= 3*Every; n++ {
		if Keep(n) {
			kept = append(kept, n)
		}
	}
	want := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 1024, 2048, 3072}
	if len(kept) != len(want) {
		t.Fatalf("kept %v, want %v", kept, want)
	}
	for i := range want {
		if kept[i] != want[i] {
			t.Fatalf("kept %v, want %v", kept, want)
		}
	}
	if KeepFirst(uint64(9), 8) || !KeepFirst(uint64(8), 8) || !KeepFirst(uint64(2048), 8) {
		t.Fatal("KeepFirst(…, 8): the first 8, then one in 1024")
	}
}
