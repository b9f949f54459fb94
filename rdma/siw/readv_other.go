//go:build !linux

package siw

import "net"

// vectored is the Linux readv path; elsewhere payloads are read with
// plain reads.
type vectored struct{}

func (v *vectored) init(net.Conn)                    {}
func (v *vectored) ok() bool                         { return false }
func (v *vectored) fill(x *reader, rem []byte) error { return nil }
