package interop

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMetricsReflectQemuBench: the Prometheus endpoint counts
// what QEMU's iSCSI driver did — its reads, writes and bytes, and their
// latency histogram — and a refused login.
func TestMetricsReflectQemuBench(t *testing.T) {
	long(t)
	need(t, "qemu-img", "iscsi-inq")
	maddr := freePort(t)
	d := serve(t, "--metrics", maddr)
	url := d.url(defaultIQN, 0)
	mustRun(t, 3*time.Minute, "qemu-img", "bench", "-f", "raw", "-d", "8", "-s", "4096", "-c", "3000", url)
	mustRun(t, 3*time.Minute, "qemu-img", "bench", "-f", "raw", "-d", "8", "-s", "65536", "-c", "500", "-w", url)
	// A login to a target that does not exist fails (0203).
	run(t, 30*time.Second, "iscsi-inq", "iscsi://"+d.addr+"/iqn.2026-11.org.blockwire:nothing/0")

	resp, err := http.Get("http://" + maddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	value := func(name string, labels ...string) float64 {
		t.Helper()
		for _, line := range strings.Split(text, "\n") {
			if !strings.HasPrefix(line, name+"{") {
				continue
			}
			ok := true
			for _, l := range labels {
				ok = ok && strings.Contains(line, l)
			}
			if ok {
				v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
		}
		t.Fatalf("no %s %v in:\n%s", name, labels, text)
		return 0
	}
	lun := `lun="0"`
	if v := value("blockwire_lun_commands_total", lun, `class="read"`); v < 3000 {
		t.Errorf("reads counted %v, qemu-img bench made 3000", v)
	}
	if v := value("blockwire_lun_commands_total", lun, `class="write"`); v < 500 {
		t.Errorf("writes counted %v, qemu-img bench made 500", v)
	}
	if v := value("blockwire_lun_bytes_total", lun, `direction="write"`); v < 500*65536 {
		t.Errorf("bytes written %v, want at least %d", v, 500*65536)
	}
	if v := value("blockwire_lun_command_duration_seconds_count", lun, `class="read"`); v < 3000 {
		t.Errorf("read latency observations %v", v)
	}
	if v := value("blockwire_lun_command_duration_seconds_bucket", lun, `class="read"`, `le="+Inf"`); v < 3000 {
		t.Errorf("read latency +Inf bucket %v", v)
	}
	if v := value("blockwire_lun_answers_waiting", lun); v != 0 {
		t.Errorf("%v answers waiting for their initiators after every command was answered", v)
	}
	if v := value("blockwire_lun_commands_in_progress", lun); v != 0 {
		t.Errorf("%v commands in progress after every command was answered", v)
	}
	if v := value("blockwire_iscsi_login_failures_total", `class="initiator_error"`); v < 1 {
		t.Errorf("failed logins %v", v)
	}
	// Two well-behaved clients met none of the bounds on what a peer
	// may make the target hold.
	for _, b := range []string{"logins_per_source", "logins", "logins_setup_evicted", "login_timeout", "sessions", "discovery_sessions", "sessions_per_source", "discovery_sessions_per_source", "discovery_idle", "data_timeout", "working_per_source"} {
		if v := value("blockwire_bounds_hit_total", `fabric="iscsi"`, `bound="`+b+`"`); v != 0 {
			t.Errorf("bounds_hit{fabric=iscsi,bound=%q} = %v after well-behaved clients", b, v)
		}
	}
	for _, fb := range [][2]string{{"iwarp", "handshakes_per_source"}, {"srp", "channels_per_source"}, {"roce", "conn_requests_per_source"}, {"control", "connections_per_source"}, {"all", "source_io_budget"}} {
		value("blockwire_bounds_hit_total", `fabric="`+fb[0]+`"`, `bound="`+fb[1]+`"`) // exported, even at 0
	}
	if !regexp.MustCompile(`(?m)^go_goroutines `).MatchString(text) {
		t.Error("no Go runtime metrics")
	}
}

// TestMetricsGuarded: the metrics name every target and initiator, so a
// web page that rebinds a name to the listener cannot read them (421), and
// a token file makes every scrape show the token (401 without; the
// warning for a non-loopback address without a token is
// cmd/blockwire's TestMetricsExposedWarning).
func TestMetricsGuarded(t *testing.T) {
	long(t)
	maddr := freePort(t)
	tok := filepath.Join(t.TempDir(), "metrics.token")
	os.WriteFile(tok, []byte("scrape-secret\n"), 0o600)
	serve(t, "--metrics", maddr, "--metrics-token-file", tok)
	get := func(host, token string) int {
		req, _ := http.NewRequest("GET", "http://"+maddr+"/metrics", nil)
		if host != "" {
			req.Host = host
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	_, port, _ := net.SplitHostPort(maddr)
	for _, c := range []struct {
		host, token string
		want        int
	}{
		{"", "scrape-secret", 200},
		{"localhost:" + port, "scrape-secret", 200},
		{"rebound.evil.example:" + port, "scrape-secret", 421},
		{"", "", 401},
		{"", "wrong", 401},
	} {
		if got := get(c.host, c.token); got != c.want {
			t.Errorf("Host %q token %q: HTTP %d, want %d", c.host, c.token, got, c.want)
		}
	}
}
