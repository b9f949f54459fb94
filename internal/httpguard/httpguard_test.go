package httpguard

import (
	"net/http"
	"testing"
)

func TestHostOK(t *testing.T) {
	for _, c := range []struct {
		listen, host string
		ok           bool
	}{
		{"127.0.0.1:9100", "127.0.0.1:9100", true},
		{"127.0.0.1:9100", "localhost:9100", true},
		{"127.0.0.1:9100", "LOCALHOST:9100", true},
		{"127.0.0.1:9100", "127.0.0.1:9101", false},
		{"127.0.0.1:9100", "evil.example:9100", false},
		{"127.0.0.1:9100", "127.0.0.2:9100", false},
		{"127.0.0.1:9100", "127.0.0.1", false},
		{"[::]:9100", "192.0.2.7:9100", true},
		{"[::]:9100", "[2001:db8::1]:9100", true},
		{"[::]:9100", "rebound.evil.example:9100", false},
		{"192.0.2.7:9100", "localhost:9100", false},
		{"[::1]:9100", "[::1]:9100", true},
	} {
		r := &http.Request{Host: c.host}
		if got := For(c.listen).HostOK(r); got != c.ok {
			t.Errorf("listen %s, Host %s: %v", c.listen, c.host, got)
		}
	}
}

func TestTokenOK(t *testing.T) {
	r := &http.Request{Header: http.Header{"Authorization": {"Bearer s3cret"}}}
	if !TokenOK(r, "s3cret") || TokenOK(r, "other") || TokenOK(&http.Request{Header: http.Header{}}, "s3cret") {
		t.Fatal("token check")
	}
}
