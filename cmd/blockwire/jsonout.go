package main

import (
	"encoding/json"
	"io"
)

// The shapes --json prints (docs/json.md). They are stable: fields may be
// added, never renamed, retyped or removed.

// discovered is one target of discover --json.
type discovered struct {
	Name string `json:"name"`
	// Addresses are the target's portals as SendTargets gave them
	// ("host:port,tpgt"); empty when it gave none.
	Addresses []string `json:"addresses"`
}

// inquired is inquiry --json.
type inquired struct {
	Vendor         string `json:"vendor"`
	Product        string `json:"product"`
	Revision       string `json:"revision"`
	DeviceType     int    `json:"device_type"` // peripheral device type (0: disk)
	Serial         string `json:"serial"`
	BlockSize      int    `json:"block_size"`
	CapacityBytes  int64  `json:"capacity_bytes"`
	CapacityBlocks int64  `json:"capacity_blocks"`
}

// benchResult is bench --json.
type benchResult struct {
	RW         string  `json:"rw"` // read, write, randread, randwrite
	BlockSize  int     `json:"bs"` // bytes
	QueueDepth int     `json:"qd"`
	Seconds    float64 `json:"seconds"`
	IOs        int64   `json:"ios"`
	IOPS       float64 `json:"iops"`
	MiBPerSec  float64 `json:"mib_per_s"`
	// LatencyUS are completion latencies in microseconds.
	LatencyUS struct {
		P50  float64 `json:"p50"`
		P99  float64 `json:"p99"`
		P999 float64 `json:"p99_9"`
		Max  float64 `json:"max"`
	} `json:"latency_us"`
	// Mismatches is present with --verify only.
	Mismatches *int64 `json:"mismatches,omitempty"`
	// IOsBySecond counts the I/Os completed in each second of the run
	// (the last second may be partial).
	IOsBySecond []int64 `json:"ios_by_second"`
	// LatencyDistribution is the latency (µs) at each of
	// latencyPercentiles: what blockwire-plot draws.
	LatencyDistribution []latencyPoint `json:"latency_distribution_us"`
}

type latencyPoint struct {
	Percentile float64 `json:"percentile"`
	US         float64 `json:"us"`
}

// latencyPercentiles are the points of bench's latency distribution:
// every percent, then finer towards the tail.
func latencyPercentiles() []float64 {
	var ps []float64
	for p := 1; p <= 99; p++ {
		ps = append(ps, float64(p))
	}
	return append(ps, 99.5, 99.9, 99.95, 99.99, 100)
}

// writeJSON prints v as indented JSON and a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
