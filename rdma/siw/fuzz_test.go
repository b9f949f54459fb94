package siw

import (
	"io"
	"log/slog"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/iwarp/ddp"
	"github.com/blockwire/blockwire/rdma/iwarp/rdmap"
)

// FuzzQPStream feeds arbitrary bytes to an established queue pair as the
// peer's FPDU stream. Whatever arrives, the QP must end or keep going
// without a panic or hang, and memory outside its registered region must
// stay untouched.
func FuzzQPStream(f *testing.F) {
	v := newEnd(0x1000)
	rr := rdmap.ReadReq{SinkSTag: 1, Size: 64, SrcSTag: v.mr.STag(), SrcTO: 0x1000}
	body := make([]byte, rdmap.ReadRequestLen)
	rr.Encode(body)
	for _, crc := range []bool{false, true} {
		var s []byte
		s = append(s, fpdu(crc, send(1, []byte("hello")))...)
		s = append(s, fpdu(crc, write(v.mr.STag(), 0x1000+100, []byte("data")))...)
		s = append(s, fpdu(crc, seg(ddp.Header{ULP: rdmap.Ctrl(rdmap.ReadRequest), QN: 1, MSN: 1, Last: true}, body))...)
		s = append(s, fpdu(crc, seg(ddp.Header{ULP: rdmap.Ctrl(rdmap.Send), MSN: 2}, []byte("part one ")))...)
		s = append(s, fpdu(crc, seg(ddp.Header{ULP: rdmap.Ctrl(rdmap.SendInvalidate), MSN: 2, MO: 9, Last: true, ULPWord: v.mr.STag()}, []byte("two")))...)
		term := (&rdmap.Term{Layer: 1, EType: 2, Code: 3}).Append(nil)
		s = append(s, fpdu(crc, seg(ddp.Header{ULP: rdmap.Ctrl(rdmap.Terminate), QN: 2, MSN: 1, Last: true}, term))...)
		f.Add(s, crc)
	}
	f.Fuzz(func(t *testing.T, stream []byte, crc bool) {
		e := newEndSize(0x1000, 4096)
		mine, peer := net.Pipe()
		p := e.params(nil)
		p.Recvs = []rdma.RecvWR{{ID: 1, Buf: make([]byte, 64)}, {ID: 2, Buf: make([]byte, 64)}}
		q := newQP(mine, p, crc, 65530, 4, 4, "fuzz", slog.New(slog.DiscardHandler))
		q.start()
		go io.Copy(io.Discard, peer)
		go func() {
			peer.Write(stream)
			peer.Close()
		}()
		select {
		case <-q.Done():
		case <-time.After(3 * time.Second):
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("queue pair did not finish\n%s", buf[:n])
		}
		e.checkGuards(t)
	})
}
