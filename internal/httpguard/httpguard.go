// Package httpguard holds the checks every HTTP control surface of
// blockwire (the administration API, the metrics) makes before serving: a
// Host that names the listener, so a web page cannot reach it after DNS
// rebinding, and a bearer token compared in constant time.
package httpguard

import (
	"crypto/subtle"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Listener describes what a request to a listener may give as its Host.
type Listener struct {
	port string
	any  bool // listening on every address
	ip   netip.Addr
}

// For returns the Host rules of a listener at addr (host:port as it
// listens).
func For(addr string) Listener {
	host, port, _ := net.SplitHostPort(addr)
	ip, _ := netip.ParseAddr(host)
	return Listener{port: port, any: ip.IsUnspecified(), ip: ip.Unmap()}
}

// HostOK reports whether the request's Host names the listener: an IP
// address it listens on (any, for a wildcard listener), or localhost for
// a loopback one, with its port. A name a web page could rebind never
// passes — a page that reaches the listener through an IP address is
// cross-origin and cannot read the answer.
func (l Listener) HostOK(r *http.Request) bool {
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil || port != l.port {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return l.any || l.ip.IsLoopback()
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	return l.any || ip.Unmap() == l.ip
}

// TokenOK reports whether the request carries "Authorization: Bearer
// token".
func TokenOK(r *http.Request, token string) bool {
	return subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+token)) == 1
}
