package iscsitarget

import (
	"testing"

	"github.com/blockwire/blockwire/iscsi/text"
)

// TestRequiredDigestsSpareDiscovery: with digests required, a Normal
// session offering only None is refused, while a Discovery session
// offering only None (as open-iscsi's does) logs in — it carries no SCSI
// data to protect. Found by the guest lab against open-iscsi.
func TestRequiredDigestsSpareDiscovery(t *testing.T) {
	s := startServer(t, Options{RequireHeaderDigest: true, RequireDataDigest: true}, nil)
	none := []text.KV{{Key: "HeaderDigest", Value: "None"}, {Key: "DataDigest", Value: "None"}}

	d := dial(t, s.addr)
	st, keys := d.login(append([]text.KV{{Key: "InitiatorName", Value: "iqn.2026-11.test:disc"}, {Key: "SessionType", Value: "Discovery"}}, none...)...)
	if st != 0 || keys["HeaderDigest"] != "None" || keys["DataDigest"] != "None" {
		t.Fatalf("discovery with digests None: status %04x, keys %v", st, keys)
	}

	n := dial(t, s.addr)
	if st, keys := n.login(normalKeys("iqn.2026-11.test:normal", none...)...); st == 0 {
		t.Fatalf("normal session without digests accepted: %v", keys)
	}
	c := dial(t, s.addr)
	st, keys = c.login(normalKeys("iqn.2026-11.test:crc", text.KV{Key: "HeaderDigest", Value: "None,CRC32C"}, text.KV{Key: "DataDigest", Value: "CRC32C"})...)
	if st != 0 || keys["HeaderDigest"] != "CRC32C" || keys["DataDigest"] != "CRC32C" {
		t.Fatalf("normal session offering CRC32C: status %04x, keys %v", st, keys)
	}
}
