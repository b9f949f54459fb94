package dhchap

import (
	"bytes"
	"encoding/hex"
	"math/big"
	"strings"
	"testing"
)

// TestResponseKnownAnswer: the host's response for a secret transformed
// with SHA-256, without and with a Diffie-Hellman secret, as OpenSSL's
// HMAC computes it over the fields NVMe Base 2.0 lists (the challenge,
// augmented with H(DH secret) when there is one; sequence number and
// transaction ID little-endian; SC_C; "HostHost"; host NQN, a NUL,
// subsystem NQN).
func TestResponseKnownAnswer(t *testing.T) {
	key, c := make([]byte, 32), make([]byte, 32)
	for i := range key {
		key[i], c[i] = byte(i), byte(32+i)
	}
	s := Secret{Key: key, Transform: SHA256}
	const host, sub = "nqn.2014-08.org.nvmexpress:uuid:host", "nqn.2026-11.io.blockwire:test"
	if got := hex.EncodeToString(s.transformed(host)); got != "d06bfe416d2de81dd5cccafd02bca7f68fe6d9ed50c7393fa37471335959cdf7" {
		t.Errorf("transformed key %s", got)
	}
	if got := hex.EncodeToString(Response(s, SHA256, "HostHost", c, 0x01020304, 0x0506, host, sub, nil)); got != "e225366b00ed21dfb879b691ce8ab0d4c23aca9488608e8baab6581ea7b0ec5e" {
		t.Errorf("response %s", got)
	}
	dh := bytes.Repeat([]byte{0xaa}, 256)
	if got := hex.EncodeToString(Response(s, SHA256, "HostHost", c, 0x01020304, 0x0506, host, sub, dh)); got != "c1a8f34d22890f02a747b3fb89c393413c1e736aa96d688f6916ac48c4a4e034" {
		t.Errorf("response with a DH secret %s", got)
	}
}

// TestSecrets: the DHHC-1 form round-trips; a wrong CRC, a wrong length,
// an unknown transform or another form is refused.
func TestSecrets(t *testing.T) {
	for _, n := range []int{32, 48, 64} {
		s := NewSecret(n, SHA384)
		back, err := ParseSecret(s.String() + "\n")
		if err != nil || !bytes.Equal(back.Key, s.Key) || back.Transform != SHA384 {
			t.Fatalf("%d bytes: %v %+v", n, err, back)
		}
	}
	good := NewSecret(32, 0).String()
	bad := []string{
		strings.Replace(good, good[10:12], "ZZ", 1), // base64 and CRC both off
		"DHHC-1:04:" + good[10:],
		"DHHC-1:00:" + "AAAA" + ":",
		"CHAP:" + good,
		good[:len(good)-1],
	}
	for _, b := range bad {
		if _, err := ParseSecret(b); err == nil {
			t.Errorf("%q accepted", b)
		}
	}
	// A key with the CRC of another.
	a, b := NewSecret(32, 0), NewSecret(32, 0)
	sa, sb := a.String(), b.String()
	mixed := sa[:10] + sb[10:10+40] + sa[10+40:]
	if _, err := ParseSecret(mixed); err == nil {
		t.Errorf("%q (a key with another key's CRC) accepted", mixed)
	}
}

// TestGroups: each prime is RFC 7919's — p = 2^b − 2^(b−64) + (⌊2^(b−130)·e⌋ + X)·2^64 − 1
// with the RFC's X, a safe prime — and two key pairs agree on a secret;
// a public value of 1 or p−1 is refused.
func TestGroups(t *testing.T) {
	xs := map[Group]int64{FFDHE2048: 560316, FFDHE3072: 2625351, FFDHE4096: 5736041, FFDHE6144: 15705020, FFDHE8192: 10965728}
	const prec = 9000
	e, term := new(big.Float).SetPrec(prec).SetInt64(1), new(big.Float).SetPrec(prec).SetInt64(1)
	for k := int64(1); k < 2500; k++ {
		term.Quo(term, new(big.Float).SetPrec(prec).SetInt64(k))
		e.Add(e, term)
	}
	one := big.NewInt(1)
	for g, x := range xs {
		p := g.Prime()
		b := p.BitLen()
		want := new(big.Int).Lsh(one, uint(b))
		want.Sub(want, new(big.Int).Lsh(one, uint(b-64)))
		f, _ := new(big.Float).SetPrec(prec).SetMantExp(e, b-130).Int(nil)
		f.Add(f, big.NewInt(x))
		want.Add(want, f.Lsh(f, 64))
		want.Sub(want, one)
		if p.Cmp(want) != 0 {
			t.Errorf("group %d: not RFC 7919's prime", g)
		}
		if testing.Short() || g > FFDHE3072 {
			continue // the formula pins the others; primality of the big ones takes long
		}
		if !p.ProbablyPrime(8) || !new(big.Int).Rsh(p, 1).ProbablyPrime(8) {
			t.Errorf("group %d: not a safe prime", g)
		}
	}
	for _, g := range []Group{FFDHE2048, FFDHE8192} {
		a, _ := NewKeyPair(g)
		b, _ := NewKeyPair(g)
		s1, err1 := a.Secret(b.Public)
		s2, err2 := b.Secret(a.Public)
		if err1 != nil || err2 != nil || !bytes.Equal(s1, s2) || len(s1) != g.Len() {
			t.Fatalf("group %d: secrets differ: %v %v", g, err1, err2)
		}
		top := new(big.Int).Sub(g.Prime(), one).FillBytes(make([]byte, g.Len()))
		for _, bad := range [][]byte{big.NewInt(1).FillBytes(make([]byte, g.Len())), top, a.Public[1:]} {
			if _, err := a.Secret(bad); err == nil {
				t.Errorf("group %d: public value %x… accepted", g, bad[:4])
			}
		}
	}
	if kp, err := NewKeyPair(Null); kp != nil || err != nil {
		t.Error("a key pair in the Null group")
	}
}

// TestMessagesRoundTrip: each message reads back as written.
func TestMessagesRoundTrip(t *testing.T) {
	n := Negotiate{TID: 9, Hashes: Hashes(), Groups: Groups()}
	var n2 Negotiate
	if err := n2.Decode(n.Append(nil)); err != nil || !n2.Offered || n2.TID != 9 || len(n2.Hashes) != 3 || len(n2.Groups) != 6 {
		t.Fatalf("negotiate: %v %+v", err, n2)
	}
	c := Challenge{TID: 9, Hash: SHA384, Group: FFDHE2048, Seq: 77, C: bytes.Repeat([]byte{1}, 48), DH: bytes.Repeat([]byte{2}, 256)}
	var c2 Challenge
	if err := c2.Decode(c.Append(nil)); err != nil || c2.Seq != 77 || !bytes.Equal(c2.DH, c.DH) || !bytes.Equal(c2.C, c.C) {
		t.Fatalf("challenge: %v %+v", err, c2)
	}
	r := Reply{TID: 9, CValid: true, Seq: 5, R: bytes.Repeat([]byte{3}, 48), C: bytes.Repeat([]byte{4}, 48), DH: bytes.Repeat([]byte{5}, 256)}
	var r2 Reply
	if err := r2.Decode(r.Append(nil), SHA384); err != nil || !r2.CValid || !bytes.Equal(r2.C, r.C) || !bytes.Equal(r2.DH, r.DH) {
		t.Fatalf("reply: %v %+v", err, r2)
	}
	if err := r2.Decode(r.Append(nil), SHA256); err == nil {
		t.Fatal("a reply for another hash read")
	}
	s := Success1{TID: 9, HL: 48, RValid: true, R: r.R}
	var s2 Success1
	if err := s2.Decode(s.Append(nil)); err != nil || !bytes.Equal(s2.R, r.R) {
		t.Fatalf("success1: %v %+v", err, s2)
	}
}

// FuzzMessages: no input makes a decoder panic, and what decodes
// re-encodes to a message that decodes the same.
func FuzzMessages(f *testing.F) {
	n := Negotiate{TID: 1, Hashes: Hashes(), Groups: Groups()}
	f.Add(n.Append(nil))
	c := Challenge{TID: 1, Hash: SHA256, Group: Null, Seq: 1, C: make([]byte, 32)}
	f.Add(c.Append(nil))
	r := Reply{TID: 1, R: make([]byte, 32), C: make([]byte, 32)}
	f.Add(r.Append(nil))
	f.Add(Failure(IDFailure1, 1, ReasonFailed))
	f.Fuzz(func(t *testing.T, b []byte) {
		Header(b)
		var n Negotiate
		if n.Decode(b) == nil && n.Offered {
			var n2 Negotiate
			if err := n2.Decode(n.Append(nil)); err != nil || len(n2.Hashes) != len(n.Hashes) {
				t.Fatalf("negotiate re-encoded: %v", err)
			}
		}
		var c Challenge
		if c.Decode(b) == nil {
			var c2 Challenge
			if err := c2.Decode(c.Append(nil)); err != nil || !bytes.Equal(c2.C, c.C) {
				t.Fatalf("challenge re-encoded: %v", err)
			}
		}
		for _, h := range Hashes() {
			var r Reply
			if r.Decode(b, h) == nil {
				var r2 Reply
				if err := r2.Decode(r.Append(nil), h); err != nil || !bytes.Equal(r2.R, r.R) {
					t.Fatalf("reply re-encoded: %v", err)
				}
			}
		}
		var s Success1
		s.Decode(b)
		ParseSecret(string(b))
	})
}
