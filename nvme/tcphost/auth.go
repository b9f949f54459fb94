package tcphost

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/blockwire/blockwire/nvme"
	"github.com/blockwire/blockwire/nvme/dhchap"
)

// ErrAuthentication is an authentication the controller refused, or one
// the host refused (the controller's response did not prove it).
var ErrAuthentication = errors.New("tcphost: DH-HMAC-CHAP authentication failed")

// authSeq numbers the host's challenges to controllers (never 0).
type authSeq struct{ n atomic.Uint32 }

func (s *authSeq) next() uint32 {
	for {
		if v := s.n.Add(1); v != 0 {
			return v
		}
	}
}

// authenticate runs DH-HMAC-CHAP on queue q (NVMe Base 2.0,
// "Authentication", the host's side): negotiate every hash and group,
// answer the controller's challenge, and with a controller secret, check
// the controller's answer to ours.
func (c *Controller) authenticate(ctx context.Context, q *queue) error {
	if c.o.DHCHAP == nil {
		return errors.New("tcphost: the controller asks for DH-HMAC-CHAP and no secret is given")
	}
	var b [2]byte
	rand.Read(b[:])
	tid := uint16(b[0]) | uint16(b[1])<<8
	send := func(msg []byte) error {
		cmd := nvme.Command{Opcode: nvme.AdminFabrics, NSID: nvme.FabricsAuthSend,
			CDW: [6]uint32{uint32(dhchap.SECP)<<24 | uint32(dhchap.SPSP1)<<16 | uint32(dhchap.SPSP0)<<8, uint32(len(msg))}}
		_, err := q.do(ctx, &cmd, msg, ToController)
		return err
	}
	recv := func() ([]byte, error) {
		buf := make([]byte, 4096)
		cmd := nvme.Command{Opcode: nvme.AdminFabrics, NSID: nvme.FabricsAuthReceive,
			CDW: [6]uint32{uint32(dhchap.SECP)<<24 | uint32(dhchap.SPSP1)<<16 | uint32(dhchap.SPSP0)<<8, uint32(len(buf))}}
		if _, err := q.do(ctx, &cmd, buf, FromController); err != nil {
			return nil, err
		}
		typ, id, _, err := dhchap.Header(buf)
		if err != nil {
			return nil, err
		}
		if typ == dhchap.TypeCommon && id == dhchap.IDFailure1 {
			return nil, fmt.Errorf("%w: the controller refused it (reason %#x)", ErrAuthentication, buf[7])
		}
		return buf, nil
	}
	neg := dhchap.Negotiate{TID: tid, Hashes: c.o.AuthHashes, Groups: c.o.AuthGroups}
	if neg.Hashes == nil {
		neg.Hashes = dhchap.Hashes()
	}
	if neg.Groups == nil {
		neg.Groups = dhchap.Groups()
	}
	if err := send(neg.Append(nil)); err != nil {
		return err
	}
	msg, err := recv()
	if err != nil {
		return err
	}
	var ch dhchap.Challenge
	if err := ch.Decode(msg); err != nil {
		return err
	}
	var dh []byte
	r := dhchap.Reply{TID: tid}
	if ch.Group != dhchap.Null {
		kp, err := dhchap.NewKeyPair(ch.Group)
		if err != nil || kp == nil {
			return fmt.Errorf("tcphost: DH group %d: %v", ch.Group, err)
		}
		if dh, err = kp.Secret(ch.DH); err != nil {
			return err
		}
		r.DH = kp.Public
	}
	r.R = dhchap.Response(*c.o.DHCHAP, ch.Hash, "HostHost", ch.C, ch.Seq, tid, c.o.HostNQN, c.subNQN, dh)
	r.C = make([]byte, ch.Hash.Len())
	if c.o.DHCHAPCtrl != nil {
		r.CValid = true
		r.Seq = c.seq.next()
		rand.Read(r.C)
	}
	if err := send(r.Append(nil)); err != nil {
		return err
	}
	if msg, err = recv(); err != nil {
		return err
	}
	var s1 dhchap.Success1
	if err := s1.Decode(msg); err != nil {
		return err
	}
	if !r.CValid {
		return nil
	}
	want := dhchap.Response(*c.o.DHCHAPCtrl, ch.Hash, "Controller", r.C, r.Seq, tid, c.subNQN, c.o.HostNQN, dh)
	if !s1.RValid || !hmac.Equal(s1.R, want) {
		send(dhchap.Failure(dhchap.IDFailure2, tid, dhchap.ReasonFailed))
		return fmt.Errorf("%w: the controller's response does not prove its secret", ErrAuthentication)
	}
	return send(dhchap.Success2(tid))
}
