// Package metrics exports a running blockwire's counters to Prometheus:
// commands, bytes, latency and errors per LUN and per session, the
// sessions themselves and failed logins. It keeps no counters of its own:
// at each scrape it reads those the SCSI core (target.Stats) and the iSCSI
// server keep, so the I/O path pays only their atomic adds.
package metrics

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/blockwire/blockwire/internal/httpguard"
	"github.com/blockwire/blockwire/scsitarget"
)

// Source is what a collector reads at each scrape: the devices (targets)
// and every fabric's sessions of one blockwire node.
type Source interface {
	Devices() []*scsitarget.Device
	Sessions() []scsitarget.SessionInfo
	// LoginFailures counts failed iSCSI logins by status class (RFC 7143
	// §11.13.5): index 1 redirection, 2 initiator error, 3 target error.
	LoginFailures() [4]uint64
	// BoundsHit counts, by fabric (iscsi, srp, iwarp, roce, nvme; control for
	// the administration and metrics listeners) and bound, the times a
	// peer met a bound on what it may make the node hold
	// (iscsi/iscsitarget.Server.BoundsHit and its kin).
	BoundsHit() map[string]map[string]uint64
}

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	src Source

	lunCmds, lunBytes, lunErrs, lunLat *prometheus.Desc
	lunWaiting, lunInProgress          *prometheus.Desc
	sesCmds, sesBytes, sesLat          *prometheus.Desc
	sessions, loginFail                *prometheus.Desc
	boundsHit                          *prometheus.Desc
}

// New returns a collector reading src's LUNs and sessions.
func New(src Source) *Collector {
	lun := []string{"target", "lun"}
	// A session: its fabric (iscsi, iser, srp), target, initiator, the
	// initiator's port (iSCSI ISID; empty for SRP) and its ID (iSCSI
	// TSIH, srp-N).
	ses := []string{"fabric", "target", "initiator", "port", "session"}
	return &Collector{src: src,
		lunCmds:       prometheus.NewDesc("blockwire_lun_commands_total", "Commands completed (SCSI and NVMe I/O), by class (read, write, other).", append(lun, "class"), nil),
		lunBytes:      prometheus.NewDesc("blockwire_lun_bytes_total", "Bytes moved by reads and writes.", append(lun, "direction"), nil),
		lunErrs:       prometheus.NewDesc("blockwire_lun_errors_total", "Commands that did not end GOOD, by kind (a sense key's name, reservation_conflict, busy; nvme_error: an NVMe command's other errors).", append(lun, "kind"), nil),
		lunLat:        prometheus.NewDesc("blockwire_lun_command_duration_seconds", "Command latency from arrival to completion, by class.", append(lun, "class"), nil),
		lunWaiting:    prometheus.NewDesc("blockwire_lun_answers_waiting", "Answers written or sent and not yet taken by their initiators (their workers are counted out of the LUN's).", lun, nil),
		lunInProgress: prometheus.NewDesc("blockwire_lun_commands_in_progress", "Commands arrived and not ended: waiting for their data, a worker or the storage, or for their answer to be taken.", lun, nil),
		sesCmds:       prometheus.NewDesc("blockwire_session_commands_total", "Commands completed in a session (an NVMe controller's I/O commands), by class.", append(ses, "class"), nil),
		sesBytes:      prometheus.NewDesc("blockwire_session_bytes_total", "Bytes moved by a session's reads and writes.", append(ses, "direction"), nil),
		sesLat:        prometheus.NewDesc("blockwire_session_command_duration_seconds", "Command latency in a session, by class.", append(ses, "class"), nil),
		sessions:      prometheus.NewDesc("blockwire_sessions", "Sessions (SRP: I_T nexuses) logged in, by fabric and type.", []string{"fabric", "type"}, nil),
		loginFail:     prometheus.NewDesc("blockwire_iscsi_login_failures_total", "Failed logins, by status class.", []string{"class"}, nil),
		boundsHit:     prometheus.NewDesc("blockwire_bounds_hit_total", "Times a peer met a bound on what it may make the node hold (connections closed, logins or connection requests refused, commands held back), by fabric and bound.", []string{"fabric", "bound"}, nil),
	}
}

// Handler serves the collector (and the Go runtime's metrics) in the
// Prometheus text format, for GET /metrics.
func Handler(c *Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// Protect guards the metrics of a listener at addr: the Host must name
// it (a web page that rebinds a name to it cannot read target and
// initiator names: 421), and when token is set every scrape must send
// "Authorization: Bearer token" (401) — Prometheus's authorization
// credentials_file.
func Protect(h http.Handler, addr, token string) http.Handler {
	l := httpguard.For(addr)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !l.HostOK(r) {
			http.Error(w, "Host does not name this listener", http.StatusMisdirectedRequest)
			return
		}
		if token != "" && !httpguard.TokenOK(r, token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="blockwire metrics"`)
			http.Error(w, "bearer token required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lunCmds, c.lunBytes, c.lunErrs, c.lunLat, c.lunWaiting, c.lunInProgress, c.sesCmds, c.sesBytes, c.sesLat, c.sessions, c.loginFail, c.boundsHit} {
		ch <- d
	}
}

func className(cl int) string {
	switch cl {
	case scsitarget.ClassRead:
		return "read"
	case scsitarget.ClassWrite:
		return "write"
	}
	return "other"
}

// senseKeys names the sense keys (SPC-4 Table 52) for the errors metric.
func senseKey(k int) string {
	names := [16]string{"no_sense", "recovered_error", "not_ready", "medium_error", "hardware_error",
		"illegal_request", "unit_attention", "data_protect", "blank_check", "vendor_specific",
		"copy_aborted", "aborted_command", "reserved_0c", "volume_overflow", "miscompare", "completed"}
	return names[k&15]
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	bounds := scsitarget.LatencyBounds()
	hist := func(d *prometheus.Desc, s *scsitarget.Stats, cl int, labels ...string) {
		buckets := make(map[float64]uint64, len(bounds))
		var cum uint64
		for i, b := range bounds {
			cum += s.Latency[cl][i].Load()
			buckets[b.Seconds()] = cum
		}
		count := cum + s.Latency[cl][len(bounds)].Load()
		sum := float64(s.LatencySum[cl].Load()) / 1e9
		ch <- prometheus.MustNewConstHistogram(d, count, sum, buckets, append(labels, className(cl))...)
	}
	counters := func(cmds, bytes, lat *prometheus.Desc, s *scsitarget.Stats, labels ...string) {
		for cl := range scsitarget.NumClasses {
			ch <- prometheus.MustNewConstMetric(cmds, prometheus.CounterValue, float64(s.Commands[cl].Load()), append(labels, className(cl))...)
			hist(lat, s, cl, labels...)
		}
		ch <- prometheus.MustNewConstMetric(bytes, prometheus.CounterValue, float64(s.Bytes[scsitarget.ClassRead].Load()), append(labels, "read")...)
		ch <- prometheus.MustNewConstMetric(bytes, prometheus.CounterValue, float64(s.Bytes[scsitarget.ClassWrite].Load()), append(labels, "write")...)
	}
	{
		for _, d := range c.src.Devices() {
			for _, n := range d.LUNs() {
				lu := d.LU(n)
				if lu == nil {
					continue
				}
				s := lu.Stats()
				labels := []string{d.Name(), strconv.FormatUint(n, 10)}
				counters(c.lunCmds, c.lunBytes, c.lunLat, s, labels...)
				for k := range s.CheckConditions {
					if v := s.CheckConditions[k].Load(); v > 0 {
						ch <- prometheus.MustNewConstMetric(c.lunErrs, prometheus.CounterValue, float64(v), append(labels, senseKey(k))...)
					}
				}
				ch <- prometheus.MustNewConstMetric(c.lunErrs, prometheus.CounterValue, float64(s.Conflicts.Load()), append(labels, "reservation_conflict")...)
				ch <- prometheus.MustNewConstMetric(c.lunErrs, prometheus.CounterValue, float64(s.Busy.Load()), append(labels, "busy")...)
				ch <- prometheus.MustNewConstMetric(c.lunErrs, prometheus.CounterValue, float64(s.Failed.Load()), append(labels, "nvme_error")...)
				ch <- prometheus.MustNewConstMetric(c.lunWaiting, prometheus.GaugeValue, float64(lu.Detached()), labels...)
				ch <- prometheus.MustNewConstMetric(c.lunInProgress, prometheus.GaugeValue, float64(lu.InProgress()), labels...)
			}
		}
	}
	count := map[[2]string]int{}
	for _, f := range []string{"iscsi", "iser", "srp"} {
		count[[2]string{f, "normal"}] = 0
	}
	count[[2]string{"iscsi", "discovery"}] = 0
	for _, si := range c.src.Sessions() {
		if si.Discovery {
			count[[2]string{si.Fabric, "discovery"}]++
			continue
		}
		count[[2]string{si.Fabric, "normal"}]++
		if si.Stats != nil {
			counters(c.sesCmds, c.sesBytes, c.sesLat, si.Stats, si.Fabric, si.Target, si.Initiator, si.Port, si.ID)
		}
	}
	for k, v := range count {
		ch <- prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(v), k[0], k[1])
	}
	lf := c.src.LoginFailures()
	for i, name := range []string{"", "redirection", "initiator_error", "target_error"} {
		if name != "" {
			ch <- prometheus.MustNewConstMetric(c.loginFail, prometheus.CounterValue, float64(lf[i]), name)
		}
	}
	for fabric, bounds := range c.src.BoundsHit() {
		for bound, n := range bounds {
			ch <- prometheus.MustNewConstMetric(c.boundsHit, prometheus.CounterValue, float64(n), fabric, bound)
		}
	}
}
