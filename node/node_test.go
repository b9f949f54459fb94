package node

import (
	"net"
	"testing"
)

func TestMetricsExposedWarning(t *testing.T) {
	for _, c := range []struct {
		ip    string
		token string
		want  bool
	}{
		{"127.0.0.1", "", false}, {"::1", "", false}, {"0.0.0.0", "", true}, {"::", "", true},
		{"192.0.2.7", "", true}, {"192.0.2.7", "t", false},
	} {
		if got := metricsExposed(&net.TCPAddr{IP: net.ParseIP(c.ip), Port: 9100}, c.token); got != c.want {
			t.Errorf("%s token %q: %v", c.ip, c.token, got)
		}
	}
}
