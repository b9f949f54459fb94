package iscsitarget

import (
	"context"
	"net"
	"time"

	"github.com/blockwire/blockwire/iscsi/auth"
)

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

type authCreds = auth.Credentials

func dialErr(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return c, err
}
