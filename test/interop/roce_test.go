package interop

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestISEROverRoCEDecodedByTshark: our initiator and target over the
// software RoCEv2 device — bench --verify through iSER whose
// connection is made with the InfiniBand CM over UDP — and Wireshark's
// infiniband dissector decodes every packet: the CM handshake, RC packets
// with iSER and iSCSI inside, no malformed frame.
func TestISEROverRoCEDecodedByTshark(t *testing.T) {
	long(t)
	need(t, "tshark")
	udp := freePort(t)
	_, udpPort, _ := strings.Cut(udp, ":")
	pcap, stop := captureFilter(t, "udp port "+udpPort)
	// One datagram per packet, both ends: on loopback a capture sees a GSO datagram
	// whole, which no dissector cuts into its packets. (TestGSOOverVeth in
	// rdma/roce checks those datagrams against Linux's segmentation.)
	d := serve(t, "--roce-listen", "127.0.0.2:3260", "--roce-udp-port", udpPort, "--roce-gso=false")
	// The TCP portal answers first; the RoCEv2 one follows.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(d.log.String(), "serving iSER over RDMA/CM"); {
		if time.Now().After(deadline) {
			t.Fatalf("no RoCEv2 portal:\n%s", d.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	url := "iser://127.0.0.2:3260/" + defaultIQN + "/0"
	for _, rw := range []string{"write", "randread"} {
		out, code := blockwire(t, "bench", "--rw", rw, "--bs", "16k", "--qd", "4", "--time", "1s", "--size", "4MiB", "--verify", "--overwrite", "--roce", "127.0.0.1:"+udpPort, "--roce-gso=false", url)
		if code != 0 || !strings.Contains(out, "verify: 0 mismatches") {
			t.Fatalf("bench --verify %s over RoCEv2 (exit %d):\n%s", rw, code, out)
		}
	}
	stop()
	dec := "udp.port==" + udpPort + ",infiniband"
	all := stdout(t, "tshark", "-r", pcap, "-d", dec)
	n := strings.Count(all, "\n")
	for _, want := range []string{"CM: ConnectRequest", "CM: ConnectReply", "CM: ReadyToUse", "RC Acknowledge", "Login Command", "SCSI: Write", "SCSI: Read"} {
		if !strings.Contains(all, want) {
			t.Errorf("tshark shows no %q in %d packets", want, n)
		}
	}
	if bad := stdout(t, "tshark", "-r", pcap, "-d", dec, "-Y", "_ws.malformed || _ws.expert.severity >= error"); strings.TrimSpace(bad) != "" {
		t.Errorf("malformed or erroneous frames:\n%s", bad)
	}
	iserFrames := strings.Count(stdout(t, "tshark", "-r", pcap, "-d", dec, "-Y", "iser"), "\n")
	if iserFrames < 10 {
		t.Errorf("only %d packets recognised as iSER", iserFrames)
	}
	t.Logf("%d RoCEv2 packets decoded, %d of them iSER (%s)", n, iserFrames, strconv.Quote(dec))
}
