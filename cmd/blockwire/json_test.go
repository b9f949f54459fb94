package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/node"
)

// decodeStrict decodes b into v refusing fields the documented shape
// (docs/json.md) lacks, and anything after the value.
func decodeStrict(t *testing.T, what string, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, b)
	}
	if dec.More() {
		t.Fatalf("%s: more than one JSON value\n%s", what, b)
	}
}

// TestJSONOutputs: discover, inquiry, bench and admin sessions/luns with
// --json against a live node print their documented shapes (docs/json.md)
// with the values the node has.
func TestJSONOutputs(t *testing.T) {
	const iqn = "iqn.2026-11.org.example:json"
	sock := filepath.Join(t.TempDir(), "admin.sock")
	iser := false
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, AdminSocket: sock, ISER: &iser,
		Targets: []config.Target{{Name: iqn, LUNs: []config.LUN{{ID: 0, Size: "8MiB"}}}}}
	n, err := node.New(cfg, node.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.Shutdown(ctx)
	})
	addr := ""
	for _, p := range n.Portals() {
		if p.Transport == "iscsi" {
			addr = p.Address
		}
	}
	if addr == "" {
		t.Fatalf("no iSCSI portal in %v", n.Portals())
	}
	url := "iscsi://" + addr + "/" + iqn + "/0"
	cli := func(args ...string) []byte {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 0 {
			t.Fatalf("blockwire %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
		}
		return out.Bytes()
	}

	var ts []discovered
	decodeStrict(t, "discover", cli("discover", "--json", addr), &ts)
	if len(ts) != 1 || ts[0].Name != iqn || len(ts[0].Addresses) == 0 || !strings.Contains(ts[0].Addresses[0], ",1") {
		t.Errorf("discover --json: %+v", ts)
	}

	var in inquired
	decodeStrict(t, "inquiry", cli("inquiry", "--json", url), &in)
	if in.DeviceType != 0 || in.BlockSize != 512 || in.CapacityBytes != 8<<20 || in.CapacityBlocks != 8<<20/512 || in.Vendor == "" || in.Serial == "" {
		t.Errorf("inquiry --json: %+v", in)
	}

	var br benchResult
	decodeStrict(t, "bench", cli("bench", "--json", "--rw", "randwrite", "--verify", "--qd", "2", "--time", "300ms", "--size", "1MiB", url), &br)
	if br.RW != "randwrite" || br.BlockSize != 4096 || br.QueueDepth != 2 || br.IOs <= 0 || br.IOPS <= 0 || br.Seconds <= 0 ||
		br.LatencyUS.P50 <= 0 || br.LatencyUS.Max < br.LatencyUS.P99 || br.Mismatches == nil || *br.Mismatches != 0 {
		t.Errorf("bench --json: %+v", br)
	}
	var plain benchResult
	decodeStrict(t, "bench without --verify", cli("bench", "--json", "--qd", "1", "--time", "200ms", "--size", "1MiB", url), &plain)
	if plain.Mismatches != nil || plain.RW != "randread" {
		t.Errorf("bench --json without --verify: %+v", plain)
	}

	var ls []admin.LUN
	decodeStrict(t, "admin luns", cli("admin", "--socket", sock, "--json", "luns"), &ls)
	if len(ls) != 1 || ls[0].Target != iqn || ls[0].Size != 8<<20 || ls[0].BlockSize != 512 {
		t.Errorf("admin --json luns: %+v", ls)
	}
	var ss []admin.Session
	decodeStrict(t, "admin sessions", cli("admin", "--socket", sock, "--json", "sessions"), &ss)
	if ss == nil {
		t.Error("admin --json sessions: null, want an array")
	}
}
