// Package prefixconn puts bytes already read from a connection back in
// front of it: a portal that looked at the first bytes to tell iSCSI from
// MPA, or a datamover handing its socket to another, passes them on.
package prefixconn

import "net"

// New returns a connection that reads pre first, then from nc. A TCP
// connection keeps its vectored writes (net.Buffers).
func New(nc net.Conn, pre []byte) net.Conn {
	if len(pre) == 0 {
		return nc
	}
	pre = append([]byte(nil), pre...)
	if tc, ok := nc.(*net.TCPConn); ok {
		return &tcpConn{tc, pre}
	}
	return &anyConn{nc, pre}
}

// Socketed is a connection New made over a TCP socket: Socket returns
// the socket and whether every prefix byte has been read — from then on a
// reader may use the socket directly (the software iWARP receiver reads
// with readv(2)).
type Socketed interface{ Socket() (*net.TCPConn, bool) }

// TCP returns the TCP socket of nc — nc itself, or the socket under a
// connection New made — or nil when there is none.
func TCP(nc net.Conn) *net.TCPConn {
	switch c := nc.(type) {
	case *net.TCPConn:
		return c
	case Socketed:
		tc, _ := c.Socket()
		return tc
	}
	return nil
}

type tcpConn struct {
	*net.TCPConn
	pre []byte
}

// Socket implements Socketed.
func (c *tcpConn) Socket() (*net.TCPConn, bool) { return c.TCPConn, len(c.pre) == 0 }

func (c *tcpConn) Read(b []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(b, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.TCPConn.Read(b)
}

type anyConn struct {
	net.Conn
	pre []byte
}

func (c *anyConn) Read(b []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(b, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}
