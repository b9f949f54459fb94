package tcphost

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/nvmetcp"
)

// FuzzHost: a controller that answers the ICReq and then sends whatever
// the fuzzer makes — responses for commands never sent, data beyond a
// buffer, R2Ts for reads, termination requests — while the host has a
// read and a write in flight. The host must not panic or hang: each
// command ends, with its completion or an error.
func FuzzHost(f *testing.F) {
	var resp [nvmetcp.CapsuleRespLen]byte
	(&nvmetcp.CapsuleResp{}).Encode(resp[:])
	f.Add(resp[:])
	var r2t [nvmetcp.R2TLen]byte
	(&nvmetcp.R2T{CCCID: 1, TTag: 1, Length: 512}).Encode(r2t[:])
	f.Add(r2t[:])
	var d [nvmetcp.DataLen]byte
	(&nvmetcp.Data{Type: nvmetcp.TypeC2HData, Flags: nvmetcp.FlagLastPDU | nvmetcp.FlagSuccess, PDO: nvmetcp.DataLen, PLen: nvmetcp.DataLen + 512, Length: 512}).Encode(d[:])
	f.Add(append(d[:], make([]byte, 512)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		host, ctrl := net.Pipe()
		go func() {
			defer ctrl.Close()
			var b [nvmetcp.ICLen]byte
			if _, err := io.ReadFull(ctrl, b[:]); err != nil {
				return
			}
			(&nvmetcp.ICResp{MaxH2CData: 4096}).Encode(&b)
			ctrl.Write(b[:])
			go io.Copy(io.Discard, ctrl)
			ctrl.Write(in)
		}()
		o := Options{Dial: func(context.Context, string, string) (net.Conn, error) { return host, nil }}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		q, err := dialQueue(ctx, &o, "fuzz", 1, 4)
		if err != nil {
			return
		}
		done := make(chan struct{}, 2)
		for _, dir := range []Direction{FromController, ToController} {
			go func() {
				cmd := nvme.Command{Opcode: nvme.OpRead, CDW: [6]uint32{0, 0, 0}}
				if dir == ToController {
					cmd.Opcode = nvme.OpWrite
				}
				q.do(ctx, &cmd, make([]byte, 512), dir)
				done <- struct{}{}
			}()
		}
		<-done
		<-done
		q.close(ErrClosed)
	})
}

// FuzzParseURL: an nvme+tcp:// URL parses without a panic, and a URL it
// accepts names an address with a port and a namespace ID in range.
func FuzzParseURL(f *testing.F) {
	f.Add("nvme+tcp://127.0.0.1:4420/nqn.2026-11.io.blockwire:x/1")
	f.Add("nvme+tcp://[::1]/nqn.2014-08.org.nvmexpress.discovery")
	f.Add("nvme+tcp://host/nqn/4294967295")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURL(s)
		if err != nil {
			return
		}
		if _, _, err := net.SplitHostPort(u.Addr); err != nil {
			t.Fatalf("%q: address %q: %v", s, u.Addr, err)
		}
		if u.NSID == 0xffffffff {
			t.Fatalf("%q: the broadcast namespace ID accepted", s)
		}
	})
}
