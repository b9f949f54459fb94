// Package dhchap is NVMe's in-band authentication, DH-HMAC-CHAP (NVMe
// Base 2.0, "Authentication"; NVMe over Fabrics 1.1, Authentication Send
// and Receive): the secrets (the "DHHC-1:" form nvme-cli's gen-dhchap-key
// writes), the transformed keys, the responses, the finite-field
// Diffie-Hellman groups of RFC 7919, and the messages' codecs. No I/O: the
// controller model runs the target's side, the host its own.
package dhchap

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"math/big"
	"strings"
)

// Hash identifies a hash function (the HMAC's).
type Hash uint8

// Hash functions.
const (
	SHA256 Hash = 1
	SHA384 Hash = 2
	SHA512 Hash = 3
)

// Len is the hash's output length (0: none).
func (h Hash) Len() int {
	switch h {
	case SHA256:
		return 32
	case SHA384:
		return 48
	case SHA512:
		return 64
	}
	return 0
}

func (h Hash) new() func() hash.Hash {
	switch h {
	case SHA256:
		return sha256.New
	case SHA384:
		return sha512.New384
	case SHA512:
		return sha512.New
	}
	return nil
}

func (h Hash) String() string {
	switch h {
	case SHA256:
		return "hmac(sha256)"
	case SHA384:
		return "hmac(sha384)"
	case SHA512:
		return "hmac(sha512)"
	}
	return fmt.Sprintf("hash %d", uint8(h))
}

// Group identifies a Diffie-Hellman group: Null (no exchange) or one of
// RFC 7919's finite-field groups.
type Group uint8

// Diffie-Hellman groups.
const (
	Null      Group = 0
	FFDHE2048 Group = 1
	FFDHE3072 Group = 2
	FFDHE4096 Group = 3
	FFDHE6144 Group = 4
	FFDHE8192 Group = 5
)

// Hashes and Groups are what this package offers, strongest first (a
// controller picks the first of them its host offers).
func Hashes() []Hash  { return []Hash{SHA512, SHA384, SHA256} }
func Groups() []Group { return []Group{FFDHE8192, FFDHE6144, FFDHE4096, FFDHE3072, FFDHE2048, Null} }

// Secret is a DH-HMAC-CHAP secret: the key and the hash it is
// transformed with (0: used as it is).
type Secret struct {
	Key       []byte
	Transform Hash
}

// ParseSecret reads the "DHHC-1:XX:BASE64:" form: XX the transform's
// hash (00 none, 01 SHA-256, 02 SHA-384, 03 SHA-512), BASE64 the key of
// 32, 48 or 64 bytes followed by its CRC-32 (little-endian).
func ParseSecret(s string) (Secret, error) {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, "DHHC-1:")
	if !ok || len(rest) < 4 || rest[2] != ':' || !strings.HasSuffix(rest, ":") {
		return Secret{}, errors.New(`dhchap: a secret has the form "DHHC-1:XX:BASE64:" (nvme gen-dhchap-key)`)
	}
	var t uint8
	if _, err := fmt.Sscanf(rest[:2], "%02x", &t); err != nil || t > 3 {
		return Secret{}, fmt.Errorf("dhchap: transform %q: 00 to 03", rest[:2])
	}
	b, err := base64.StdEncoding.DecodeString(rest[3 : len(rest)-1])
	if err != nil {
		return Secret{}, fmt.Errorf("dhchap: the key's base64: %w", err)
	}
	if n := len(b) - 4; n != 32 && n != 48 && n != 64 {
		return Secret{}, fmt.Errorf("dhchap: a key of %d bytes (32, 48 or 64)", len(b)-4)
	}
	key := b[:len(b)-4]
	if crc32.ChecksumIEEE(key) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return Secret{}, errors.New("dhchap: the key's CRC-32 does not match")
	}
	return Secret{Key: key, Transform: Hash(t)}, nil
}

// String is the secret's "DHHC-1:" form.
func (s Secret) String() string {
	b := binary.LittleEndian.AppendUint32(bytes.Clone(s.Key), crc32.ChecksumIEEE(s.Key))
	return fmt.Sprintf("DHHC-1:%02x:%s:", uint8(s.Transform), base64.StdEncoding.EncodeToString(b))
}

// NewSecret makes a random secret of n bytes (32, 48 or 64) with the
// given transform.
func NewSecret(n int, t Hash) Secret {
	k := make([]byte, n)
	rand.Read(k)
	return Secret{Key: k, Transform: t}
}

// transformed is the key the responses use, for the NQN of its owner:
// HMAC(key, NQN || "NVMe-over-Fabrics") with the transform's hash.
func (s Secret) transformed(nqn string) []byte {
	if s.Transform == 0 {
		return s.Key
	}
	m := hmac.New(s.Transform.new(), s.Key)
	m.Write([]byte(nqn))
	m.Write([]byte("NVMe-over-Fabrics"))
	return m.Sum(nil)
}

// Response is a DH-HMAC-CHAP response: the host's to the controller's
// challenge (kind "HostHost", nqn1 the host's NQN, nqn2 the subsystem's,
// s the host's secret) or the controller's to the host's (kind
// "Controller", nqn1 the subsystem's, nqn2 the host's, s the controller's
// secret). dh is the Diffie-Hellman secret (nil with the Null group),
// which augments the challenge.
func Response(s Secret, h Hash, kind string, challenge []byte, seq uint32, tid uint16, nqn1, nqn2 string, dh []byte) []byte {
	c := challenge
	if dh != nil {
		d := h.new()()
		d.Write(dh)
		m := hmac.New(h.new(), d.Sum(nil))
		m.Write(challenge)
		c = m.Sum(nil)
	}
	m := hmac.New(h.new(), s.transformed(nqn1))
	m.Write(c)
	var b [7]byte
	binary.LittleEndian.PutUint32(b[0:], seq)
	binary.LittleEndian.PutUint16(b[4:], tid)
	b[6] = 0 // SC_C: no secure channel concatenation
	m.Write(b[:])
	m.Write([]byte(kind))
	m.Write([]byte(nqn1))
	m.Write([]byte{0})
	m.Write([]byte(nqn2))
	return m.Sum(nil)
}

// The primes of RFC 7919's groups (generator 2), big-endian hex.
const (
	ffdhe2048 = "ffffffffffffffffadf85458a2bb4a9aafdc5620273d3cf1d8b9c583ce2d3695" +
		"a9e13641146433fbcc939dce249b3ef97d2fe363630c75d8f681b202aec4617a" +
		"d3df1ed5d5fd65612433f51f5f066ed0856365553ded1af3b557135e7f57c935" +
		"984f0c70e0e68b77e2a689daf3efe8721df158a136ade73530acca4f483a797a" +
		"bc0ab182b324fb61d108a94bb2c8e3fbb96adab760d7f4681d4f42a3de394df4" +
		"ae56ede76372bb190b07a7c8ee0a6d709e02fce1cdf7e2ecc03404cd28342f61" +
		"9172fe9ce98583ff8e4f1232eef28183c3fe3b1b4c6fad733bb5fcbc2ec22005" +
		"c58ef1837d1683b2c6f34a26c1b2effa886b423861285c97ffffffffffffffff"
	ffdhe3072 = "ffffffffffffffffadf85458a2bb4a9aafdc5620273d3cf1d8b9c583ce2d3695" +
		"a9e13641146433fbcc939dce249b3ef97d2fe363630c75d8f681b202aec4617a" +
		"d3df1ed5d5fd65612433f51f5f066ed0856365553ded1af3b557135e7f57c935" +
		"984f0c70e0e68b77e2a689daf3efe8721df158a136ade73530acca4f483a797a" +
		"bc0ab182b324fb61d108a94bb2c8e3fbb96adab760d7f4681d4f42a3de394df4" +
		"ae56ede76372bb190b07a7c8ee0a6d709e02fce1cdf7e2ecc03404cd28342f61" +
		"9172fe9ce98583ff8e4f1232eef28183c3fe3b1b4c6fad733bb5fcbc2ec22005" +
		"c58ef1837d1683b2c6f34a26c1b2effa886b4238611fcfdcde355b3b6519035b" +
		"bc34f4def99c023861b46fc9d6e6c9077ad91d2691f7f7ee598cb0fac186d91c" +
		"aefe130985139270b4130c93bc437944f4fd4452e2d74dd364f2e21e71f54bff" +
		"5cae82ab9c9df69ee86d2bc522363a0dabc521979b0deada1dbf9a42d5c4484e" +
		"0abcd06bfa53ddef3c1b20ee3fd59d7c25e41d2b66c62e37ffffffffffffffff"
	ffdhe4096 = "ffffffffffffffffadf85458a2bb4a9aafdc5620273d3cf1d8b9c583ce2d3695" +
		"a9e13641146433fbcc939dce249b3ef97d2fe363630c75d8f681b202aec4617a" +
		"d3df1ed5d5fd65612433f51f5f066ed0856365553ded1af3b557135e7f57c935" +
		"984f0c70e0e68b77e2a689daf3efe8721df158a136ade73530acca4f483a797a" +
		"bc0ab182b324fb61d108a94bb2c8e3fbb96adab760d7f4681d4f42a3de394df4" +
		"ae56ede76372bb190b07a7c8ee0a6d709e02fce1cdf7e2ecc03404cd28342f61" +
		"9172fe9ce98583ff8e4f1232eef28183c3fe3b1b4c6fad733bb5fcbc2ec22005" +
		"c58ef1837d1683b2c6f34a26c1b2effa886b4238611fcfdcde355b3b6519035b" +
		"bc34f4def99c023861b46fc9d6e6c9077ad91d2691f7f7ee598cb0fac186d91c" +
		"aefe130985139270b4130c93bc437944f4fd4452e2d74dd364f2e21e71f54bff" +
		"5cae82ab9c9df69ee86d2bc522363a0dabc521979b0deada1dbf9a42d5c4484e" +
		"0abcd06bfa53ddef3c1b20ee3fd59d7c25e41d2b669e1ef16e6f52c3164df4fb" +
		"7930e9e4e58857b6ac7d5f42d69f6d187763cf1d5503400487f55ba57e31cc7a" +
		"7135c886efb4318aed6a1e012d9e6832a907600a918130c46dc778f971ad0038" +
		"092999a333cb8b7a1a1db93d7140003c2a4ecea9f98d0acc0a8291cdcec97dcf" +
		"8ec9b55a7f88a46b4db5a851f44182e1c68a007e5e655f6affffffffffffffff"
	ffdhe6144 = "ffffffffffffffffadf85458a2bb4a9aafdc5620273d3cf1d8b9c583ce2d3695" +
		"a9e13641146433fbcc939dce249b3ef97d2fe363630c75d8f681b202aec4617a" +
		"d3df1ed5d5fd65612433f51f5f066ed0856365553ded1af3b557135e7f57c935" +
		"984f0c70e0e68b77e2a689daf3efe8721df158a136ade73530acca4f483a797a" +
		"bc0ab182b324fb61d108a94bb2c8e3fbb96adab760d7f4681d4f42a3de394df4" +
		"ae56ede76372bb190b07a7c8ee0a6d709e02fce1cdf7e2ecc03404cd28342f61" +
		"9172fe9ce98583ff8e4f1232eef28183c3fe3b1b4c6fad733bb5fcbc2ec22005" +
		"c58ef1837d1683b2c6f34a26c1b2effa886b4238611fcfdcde355b3b6519035b" +
		"bc34f4def99c023861b46fc9d6e6c9077ad91d2691f7f7ee598cb0fac186d91c" +
		"aefe130985139270b4130c93bc437944f4fd4452e2d74dd364f2e21e71f54bff" +
		"5cae82ab9c9df69ee86d2bc522363a0dabc521979b0deada1dbf9a42d5c4484e" +
		"0abcd06bfa53ddef3c1b20ee3fd59d7c25e41d2b669e1ef16e6f52c3164df4fb" +
		"7930e9e4e58857b6ac7d5f42d69f6d187763cf1d5503400487f55ba57e31cc7a" +
		"7135c886efb4318aed6a1e012d9e6832a907600a918130c46dc778f971ad0038" +
		"092999a333cb8b7a1a1db93d7140003c2a4ecea9f98d0acc0a8291cdcec97dcf" +
		"8ec9b55a7f88a46b4db5a851f44182e1c68a007e5e0dd9020bfd64b645036c7a" +
		"4e677d2c38532a3a23ba4442caf53ea63bb454329b7624c8917bdd64b1c0fd4c" +
		"b38e8c334c701c3acdad0657fccfec719b1f5c3e4e46041f388147fb4cfdb477" +
		"a52471f7a9a96910b855322edb6340d8a00ef092350511e30abec1fff9e3a26e" +
		"7fb29f8c183023c3587e38da0077d9b4763e4e4b94b2bbc194c6651e77caf992" +
		"eeaac0232a281bf6b3a739c1226116820ae8db5847a67cbef9c9091b462d538c" +
		"d72b03746ae77f5e62292c311562a846505dc82db854338ae49f5235c95b9117" +
		"8ccf2dd5cacef403ec9d1810c6272b045b3b71f9dc6b80d63fdd4a8e9adb1e69" +
		"62a69526d43161c1a41d570d7938dad4a40e329cd0e40e65ffffffffffffffff"
	ffdhe8192 = "ffffffffffffffffadf85458a2bb4a9aafdc5620273d3cf1d8b9c583ce2d3695" +
		"a9e13641146433fbcc939dce249b3ef97d2fe363630c75d8f681b202aec4617a" +
		"d3df1ed5d5fd65612433f51f5f066ed0856365553ded1af3b557135e7f57c935" +
		"984f0c70e0e68b77e2a689daf3efe8721df158a136ade73530acca4f483a797a" +
		"bc0ab182b324fb61d108a94bb2c8e3fbb96adab760d7f4681d4f42a3de394df4" +
		"ae56ede76372bb190b07a7c8ee0a6d709e02fce1cdf7e2ecc03404cd28342f61" +
		"9172fe9ce98583ff8e4f1232eef28183c3fe3b1b4c6fad733bb5fcbc2ec22005" +
		"c58ef1837d1683b2c6f34a26c1b2effa886b4238611fcfdcde355b3b6519035b" +
		"bc34f4def99c023861b46fc9d6e6c9077ad91d2691f7f7ee598cb0fac186d91c" +
		"aefe130985139270b4130c93bc437944f4fd4452e2d74dd364f2e21e71f54bff" +
		"5cae82ab9c9df69ee86d2bc522363a0dabc521979b0deada1dbf9a42d5c4484e" +
		"0abcd06bfa53ddef3c1b20ee3fd59d7c25e41d2b669e1ef16e6f52c3164df4fb" +
		"7930e9e4e58857b6ac7d5f42d69f6d187763cf1d5503400487f55ba57e31cc7a" +
		"7135c886efb4318aed6a1e012d9e6832a907600a918130c46dc778f971ad0038" +
		"092999a333cb8b7a1a1db93d7140003c2a4ecea9f98d0acc0a8291cdcec97dcf" +
		"8ec9b55a7f88a46b4db5a851f44182e1c68a007e5e0dd9020bfd64b645036c7a" +
		"4e677d2c38532a3a23ba4442caf53ea63bb454329b7624c8917bdd64b1c0fd4c" +
		"b38e8c334c701c3acdad0657fccfec719b1f5c3e4e46041f388147fb4cfdb477" +
		"a52471f7a9a96910b855322edb6340d8a00ef092350511e30abec1fff9e3a26e" +
		"7fb29f8c183023c3587e38da0077d9b4763e4e4b94b2bbc194c6651e77caf992" +
		"eeaac0232a281bf6b3a739c1226116820ae8db5847a67cbef9c9091b462d538c" +
		"d72b03746ae77f5e62292c311562a846505dc82db854338ae49f5235c95b9117" +
		"8ccf2dd5cacef403ec9d1810c6272b045b3b71f9dc6b80d63fdd4a8e9adb1e69" +
		"62a69526d43161c1a41d570d7938dad4a40e329ccff46aaa36ad004cf600c838" +
		"1e425a31d951ae64fdb23fcec9509d43687feb69edd1cc5e0b8cc3bdf64b10ef" +
		"86b63142a3ab8829555b2f747c932665cb2c0f1cc01bd70229388839d2af05e4" +
		"54504ac78b7582822846c0ba35c35f5c59160cc046fd8251541fc68c9c86b022" +
		"bb7099876a460e7451a8a93109703fee1c217e6c3826e52c51aa691e0e423cfc" +
		"99e9e31650c1217b624816cdad9a95f9d5b8019488d9c0a0a1fe3075a577e231" +
		"83f81d4a3f2fa4571efc8ce0ba8a4fe8b6855dfe72b0a66eded2fbabfbe58a30" +
		"fafabe1c5d71a87e2f741ef8c1fe86fea6bbfde530677f0d97d11d49f7a8443d" +
		"0822e506a9f4614e011e2a94838ff88cd68c8bb7c5c6424cffffffffffffffff"
)

// Prime is g's modulus (nil for Null or an unknown group).
func (g Group) Prime() *big.Int {
	var hex string
	switch g {
	case FFDHE2048:
		hex = ffdhe2048
	case FFDHE3072:
		hex = ffdhe3072
	case FFDHE4096:
		hex = ffdhe4096
	case FFDHE6144:
		hex = ffdhe6144
	case FFDHE8192:
		hex = ffdhe8192
	default:
		return nil
	}
	p, _ := new(big.Int).SetString(hex, 16)
	return p
}

// Len is the length of g's public values and secrets (0 for Null).
func (g Group) Len() int {
	if p := g.Prime(); p != nil {
		return (p.BitLen() + 7) / 8
	}
	return 0
}

// KeyPair is one side's ephemeral Diffie-Hellman key.
type KeyPair struct {
	g      Group
	p, x   *big.Int
	Public []byte // g^x mod p, padded to the group's length
}

// NewKeyPair makes an ephemeral key in g (nil for Null).
func NewKeyPair(g Group) (*KeyPair, error) {
	p := g.Prime()
	if p == nil {
		return nil, nil
	}
	// A private exponent of twice the group's security strength at
	// least; 512 bits covers ffdhe8192's 192-bit strength.
	x, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 512))
	if err != nil {
		return nil, err
	}
	x.Add(x, big.NewInt(2))
	y := new(big.Int).Exp(big.NewInt(2), x, p)
	return &KeyPair{g: g, p: p, x: x, Public: y.FillBytes(make([]byte, g.Len()))}, nil
}

// Secret is the shared secret with the peer's public value, padded to
// the group's length; a public value outside [2, p-2] is refused.
func (k *KeyPair) Secret(peer []byte) ([]byte, error) {
	if len(peer) != k.g.Len() {
		return nil, fmt.Errorf("dhchap: a public value of %d bytes in a group of %d", len(peer), k.g.Len())
	}
	y := new(big.Int).SetBytes(peer)
	top := new(big.Int).Sub(k.p, big.NewInt(1))
	if y.Cmp(big.NewInt(1)) <= 0 || y.Cmp(top) >= 0 {
		return nil, errors.New("dhchap: the peer's public value is out of range")
	}
	z := new(big.Int).Exp(y, k.x, k.p)
	return z.FillBytes(make([]byte, k.g.Len())), nil
}
