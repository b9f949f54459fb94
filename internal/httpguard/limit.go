package httpguard

import (
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/blockwire/blockwire/internal/persource"
)

// The bounds of Limit as the node uses them: a scraper or an
// administration client needs a connection or two.
const (
	PerSource = 16
	Total     = 256
)

// NewServer returns an HTTP server for a control surface: headers within
// 10 s and 64 KiB, a request body read within 30 s, and an idle
// keep-alive connection closed after 2 minutes — none held for ever.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
}

// Limit bounds the connections l's server holds open: perSource from one
// source (src says what one is; a Unix socket's clients are one), total
// in all.
// Connections beyond are closed as they arrive, so a client that opens
// many and leaves them idle holds a few sockets, not the process's, and
// another client is still served.
func Limit(l net.Listener, src persource.Sources, perSource, total int) *Limited {
	return &Limited{Listener: l, sources: src, perSource: perSource, total: total}
}

// Limited is a listener whose connections Limit bounds.
type Limited struct {
	net.Listener
	sources          persource.Sources
	perSource, total int

	mu      sync.Mutex // a leaf: nothing else is locked under it
	open    int
	from    persource.Counts[string]
	refused persource.Refusals // connections closed for the bounds (BoundsHit)
}

// BoundsHit counts the connections closed as they arrived for the bounds:
// all the listener's (connections) and one address's
// (connections_per_source).
func (l *Limited) BoundsHit() map[string]uint64 {
	return l.refused.Hits("connections", "connections_per_source")
}

// Accept returns the next connection within the bounds, closing those
// beyond them.
func (l *Limited) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := l.sources.Of(c.RemoteAddr())
		l.mu.Lock()
		all := l.open >= l.total
		ok := !all && l.from.Take(src, l.perSource)
		if ok {
			l.open++
		}
		l.mu.Unlock()
		if !ok {
			l.refused.Refused(all)
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, l: l, src: src}, nil
	}
}

type limitedConn struct {
	net.Conn
	l    *Limited
	src  string
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() {
		l := c.l
		l.mu.Lock()
		l.open--
		l.from.Give(c.src)
		l.mu.Unlock()
	})
	return c.Conn.Close()
}
