package blockcore

import (
	"testing"
	"time"
)

func TestLatencyBucket(t *testing.T) {
	b := LatencyBounds()
	for i, bound := range b {
		if got := latencyBucket(bound); got != i {
			t.Errorf("%v: bucket %d, want %d", bound, got, i)
		}
		if got := latencyBucket(bound + 1); got != i+1 {
			t.Errorf("%v+1ns: bucket %d, want %d", bound, got, i+1)
		}
	}
	if latencyBucket(0) != 0 || latencyBucket(time.Hour) != latencyBuckets {
		t.Error("the ends")
	}
}
