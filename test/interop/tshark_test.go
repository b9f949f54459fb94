package interop

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTsharkDecodesOurTraffic captures a session between libiscsi/QEMU and
// blockwire on loopback and has Wireshark's iSCSI dissector (an
// independent decoder) read it: every PDU must dissect without a malformed
// or error-level expert item, and the exchange must contain the PDU kinds
// of login, discovery, immediate and solicited writes, reads and logout.
func TestTsharkDecodesOurTraffic(t *testing.T) {
	long(t)
	need(t, "tshark", "iscsi-ls", "qemu-img")
	if os.Geteuid() != 0 {
		t.Skip("capturing on lo needs root")
	}
	for _, digest := range []bool{false, true} {
		args := []string{"--size", "16MiB"}
		if digest {
			args = append(args, "--header-digest", "required")
		}
		d := serve(t, args...)
		port := d.addr[strings.LastIndex(d.addr, ":")+1:]
		pcap, stop := capture(t, port)
		mustRun(t, 30*time.Second, "iscsi-ls", "-s", "iscsi://"+d.addr)
		src := randomImage(t, 4<<20)
		mustRun(t, time.Minute, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, d.url(defaultIQN, 0))
		back := filepath.Join(t.TempDir(), "back.img")
		mustRun(t, time.Minute, "qemu-img", "convert", "-f", "raw", "-O", "raw", d.url(defaultIQN, 0), back)
		stop()

		decode := []string{"-2", "-r", pcap, "-d", "tcp.port==" + port + ",iscsi", "-o", "iscsi.bogus_pdu_max_data_len:16777215"}
		out := stdout(t, "tshark", append(decode, "-T", "fields", "-e", "iscsi.opcode")...)
		ops := map[string]int{}
		pdus := 0
		for _, l := range strings.Fields(out) {
			for _, op := range strings.Split(l, ",") {
				ops[op]++
				pdus++
			}
		}
		// Opcodes as tshark prints them: 0x03 Login, 0x23 Login Response,
		// 0x04/0x24 Text, 0x01 SCSI Command, 0x21 SCSI Response, 0x25
		// Data-In, 0x05 Data-Out, 0x31 R2T, 0x06/0x26 Logout.
		for _, want := range []string{"0x03", "0x23", "0x04", "0x24", "0x01", "0x21", "0x25", "0x05", "0x31", "0x06", "0x26"} {
			if ops[want] == 0 {
				t.Errorf("digest=%v: tshark saw no iSCSI opcode %s (saw %v)", digest, want, ops)
			}
		}
		bad := stdout(t, "tshark", append(decode, "-T", "fields", "-e", "frame.number", "-e", "_ws.col.Info", "-Y", "iscsi && (_ws.malformed || _ws.expert.severity == \"error\")")...)
		for _, line := range strings.Split(strings.TrimSpace(bad), "\n") {
			// Wireshark 4.0's SCSI dissector raises an exception on a VPD
			// page truncated to the INQUIRY allocation length (legal, SPC-4
			// §6.6.1), which libiscsi asks for; that is the dissector's
			// limit, not a malformed iSCSI PDU.
			if line == "" || strings.Contains(line, "(Inquiry Response Data)") {
				continue
			}
			t.Errorf("digest=%v: tshark reports a malformed or erroneous frame: %s", digest, line)
		}
		if digest && !strings.Contains(d.log.String(), "header_digest=true") {
			t.Error("no header digest was negotiated")
		}
		t.Logf("digest=%v: tshark dissected %d iSCSI PDUs: %v", digest, pdus, ops)
	}
}

// stdout runs a command and returns its standard output only (tshark
// writes a warning about running as root to standard error).
func stdout(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, errb.String())
	}
	return string(out)
}

// capture records loopback traffic on a TCP port with tshark until stop is
// called.
func capture(t *testing.T, port string) (pcap string, stop func()) {
	t.Helper()
	return captureFilter(t, "tcp port "+port)
}

// captureFilter records loopback traffic matching a capture filter.
func captureFilter(t *testing.T, filter string) (pcap string, stop func()) {
	t.Helper()
	pcap = filepath.Join(t.TempDir(), "capture.pcap")
	cap := exec.Command("tshark", "-i", "lo", "-B", "64", "-f", filter, "-w", pcap)
	stderr, _ := cap.StderrPipe()
	if err := cap.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			if !once && strings.Contains(sc.Text(), "Capturing on") {
				once = true
				close(ready)
			}
		}
		if !once {
			close(ready)
		}
	}()
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		t.Fatal("tshark did not start capturing")
	}
	time.Sleep(200 * time.Millisecond)
	return pcap, func() {
		time.Sleep(500 * time.Millisecond)
		cap.Process.Signal(syscall.SIGINT)
		cap.Wait()
	}
}
