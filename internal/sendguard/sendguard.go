// Package sendguard writes to a peer that may stop reading. A send is not
// bound as a whole — a large one to a slow but steady reader may take a
// while — but in stretches of the send timeout, each of which must move
// at least MinProgress bytes. A peer that stops reading fails the write
// after one stretch; so does one that reads a trickle, a few bytes now and
// then, which would otherwise hold the connection's buffers and tasks for
// ever with a fresh deadline each time.
package sendguard

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// MinProgress is the least a stretch of the send timeout must move: 64 KiB
// per stretch (4.4 KB/s at the default NOP timeout of 15 s) is far below
// what any live initiator or RDMA peer reads, and above what the socket
// buffers of a peer that has stopped reading take at once on loopback
// (62,560 bytes measured: a socket with a 4 KiB receive buffer).
const MinProgress = 64 << 10

// Write writes bufs to c, consuming what it wrote, and returns how much it
// wrote. With d > 0 each stretch gets a deadline d away and must move at
// least MinProgress bytes or finish; a stretch short of that fails the
// write with its timeout error. With d == 0 it is one write under whatever
// deadline c has.
func Write(c net.Conn, bufs *net.Buffers, d time.Duration) (int64, error) {
	return WriteWith(c, bufs, d, func(b *net.Buffers) (int64, error) { return b.WriteTo(c) })
}

// WriteWith is Write with write doing each stretch's writing.
func WriteWith(c net.Conn, bufs *net.Buffers, d time.Duration, write func(*net.Buffers) (int64, error)) (int64, error) {
	if d <= 0 {
		return write(bufs)
	}
	var total int64
	for len(*bufs) > 0 {
		_ = c.SetWriteDeadline(time.Now().Add(d))
		n, err := write(bufs)
		total += n
		if err == nil {
			return total, nil
		}
		if !IsTimeout(err) {
			return total, err
		}
		if n < MinProgress {
			if n > 0 {
				return total, fmt.Errorf("the peer took %d bytes in %v, under the %d a send must move (stalled): %w", n, d, MinProgress, err)
			}
			return total, err
		}
		// Slow, but reading: a fresh deadline for the rest.
	}
	return total, nil
}

// IsTimeout tells whether err is a deadline's.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
