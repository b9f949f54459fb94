// Package auth implements the target side of iSCSI CHAP authentication
// (RFC 7143 §12.1.3, RFC 1994): one-way and mutual, with MD5 (CHAP_A=5)
// and SHA-256 (CHAP_A=7, RFC 7143bis / IANA iSCSI CHAP algorithm registry).
// It is a pure state machine over key=value pairs: no I/O.
package auth

import (
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"

	"github.com/blockwire/blockwire/iscsi/text"
)

// Algorithm identifiers (CHAP_A).
const (
	MD5    = 5
	SHA256 = 7
)

func newHash(alg int) hash.Hash {
	if alg == SHA256 {
		return sha256.New()
	}
	return md5.New()
}

// Credentials is a CHAP name and secret.
type Credentials struct {
	User   string
	Secret string
}

// MinSecretLen is the shortest CHAP secret accepted: 96 bits. RFC 7143
// §12.1.3 allows shorter secrets only under IPsec encryption, which
// blockwire does not provide, since a CHAP exchange seen on the wire
// exposes the secret to an off-line dictionary attack.
const MinSecretLen = 12

// CheckSecret refuses a secret too short to use without IPsec.
func CheckSecret(secret string) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("chap: a %d-byte secret is too short: at least %d bytes (96 bits) without IPsec (RFC 7143 §12.1.3)",
			len(secret), MinSecretLen)
	}
	return nil
}

// Response computes the CHAP response H(id || secret || challenge)
// (RFC 1994 §4.1).
func Response(alg int, id byte, secret string, challenge []byte) []byte {
	h := newHash(alg)
	h.Write([]byte{id})
	h.Write([]byte(secret))
	h.Write(challenge)
	return h.Sum(nil)
}

// EncodeBinary renders binary values as 0x-prefixed hex (RFC 7143 §6.1).
func EncodeBinary(b []byte) string { return "0x" + hex.EncodeToString(b) }

// DecodeBinary parses a hex (0x) or base64 (0b) binary value.
func DecodeBinary(s string) ([]byte, error) {
	switch {
	case len(s) > 2 && (s[:2] == "0x" || s[:2] == "0X"):
		h := s[2:]
		if len(h)%2 == 1 {
			h = "0" + h
		}
		return hex.DecodeString(h)
	case len(s) > 2 && (s[:2] == "0b" || s[:2] == "0B"):
		return base64.StdEncoding.DecodeString(s[2:])
	}
	return nil, fmt.Errorf("binary value %q lacks a 0x or 0b prefix", s)
}

// ErrFailed is returned when authentication fails; the login must end with
// status 0201 (authentication failure).
var ErrFailed = errors.New("chap: authentication failed")

// Target runs CHAP as the authenticator (target side).
type Target struct {
	// Incoming are the credentials the initiator must prove.
	Incoming Credentials
	// Outgoing, if set, are the target's credentials for mutual CHAP.
	Outgoing *Credentials

	step      int
	alg       int
	id        byte
	challenge []byte
	// Done is set when the exchange has completed successfully.
	Done bool
	// Mutual is set when the initiator asked the target to authenticate.
	Mutual bool
}

// Step consumes the CHAP keys of one login request and returns the keys
// to answer with. It returns ErrFailed (wrapped with the reason) when the
// initiator's proof is wrong or the exchange is malformed.
func (t *Target) Step(kvs []text.KV) ([]text.KV, error) {
	get := func(k string) (string, bool) {
		for _, kv := range kvs {
			if kv.Key == k {
				return kv.Value, true
			}
		}
		return "", false
	}
	switch t.step {
	case 0:
		a, ok := get("CHAP_A")
		if !ok {
			return nil, nil // waiting for the algorithm list
		}
		for _, s := range strings.Split(a, ",") {
			if n, err := strconv.Atoi(s); err == nil && (n == MD5 || n == SHA256) {
				t.alg = n
				break
			}
		}
		if t.alg == 0 {
			// RFC 7143 §12.1.3: no acceptable algorithm: answer Reject and
			// fail the login.
			return []text.KV{{Key: "CHAP_A", Value: text.Reject}}, fmt.Errorf("%w: no supported CHAP_A in %q", ErrFailed, a)
		}
		var idb [1]byte
		t.challenge = make([]byte, newHash(t.alg).Size())
		if _, err := rand.Read(idb[:]); err != nil {
			return nil, err
		}
		if _, err := rand.Read(t.challenge); err != nil {
			return nil, err
		}
		t.id = idb[0]
		t.step = 1
		return []text.KV{
			{Key: "CHAP_A", Value: strconv.Itoa(t.alg)},
			{Key: "CHAP_I", Value: strconv.Itoa(int(t.id))},
			{Key: "CHAP_C", Value: EncodeBinary(t.challenge)},
		}, nil
	case 1:
		name, okN := get("CHAP_N")
		resp, okR := get("CHAP_R")
		if !okN || !okR {
			return nil, fmt.Errorf("%w: CHAP_N and CHAP_R expected", ErrFailed)
		}
		r, err := DecodeBinary(resp)
		if err != nil {
			return nil, fmt.Errorf("%w: CHAP_R: %v", ErrFailed, err)
		}
		want := Response(t.alg, t.id, t.Incoming.Secret, t.challenge)
		userOK := subtle.ConstantTimeCompare([]byte(name), []byte(t.Incoming.User)) == 1
		if !userOK || subtle.ConstantTimeCompare(r, want) != 1 {
			return nil, fmt.Errorf("%w: wrong CHAP_N or CHAP_R for user %q", ErrFailed, name)
		}
		t.step = 2
		ci, hasI := get("CHAP_I")
		cc, hasC := get("CHAP_C")
		if !hasI && !hasC {
			t.Done = true
			return nil, nil
		}
		if hasI != hasC {
			return nil, fmt.Errorf("%w: mutual CHAP needs both CHAP_I and CHAP_C", ErrFailed)
		}
		if t.Outgoing == nil {
			return nil, fmt.Errorf("%w: initiator asked for mutual CHAP but the target has no credentials", ErrFailed)
		}
		id, err := strconv.ParseUint(ci, 0, 8)
		if err != nil {
			return nil, fmt.Errorf("%w: CHAP_I %q", ErrFailed, ci)
		}
		c, err := DecodeBinary(cc)
		if err != nil || len(c) == 0 {
			return nil, fmt.Errorf("%w: CHAP_C %q", ErrFailed, cc)
		}
		if subtle.ConstantTimeCompare(c, t.challenge) == 1 {
			// RFC 7143 §12.1.3: a target must refuse a challenge equal to
			// the one it sent (reflection attack).
			return nil, fmt.Errorf("%w: initiator reflected the target's challenge", ErrFailed)
		}
		t.Mutual = true
		t.Done = true
		return []text.KV{
			{Key: "CHAP_N", Value: t.Outgoing.User},
			{Key: "CHAP_R", Value: EncodeBinary(Response(t.alg, byte(id), t.Outgoing.Secret, c))},
		}, nil
	}
	return nil, fmt.Errorf("%w: unexpected CHAP keys after the exchange completed", ErrFailed)
}
