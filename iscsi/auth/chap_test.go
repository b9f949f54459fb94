package auth

import (
	"bytes"
	"errors"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/blockwire/blockwire/internal/pcaptest"
	"github.com/blockwire/blockwire/iscsi/text"
)

func kv(pairs ...string) []text.KV {
	var out []text.KV
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, text.KV{Key: pairs[i], Value: pairs[i+1]})
	}
	return out
}

func get(kvs []text.KV, k string) string {
	for _, x := range kvs {
		if x.Key == k {
			return x.Value
		}
	}
	return ""
}

// initiatorAnswer plays the initiator's side with the given secret.
func initiatorAnswer(t *testing.T, challenge []text.KV, user, secret string) []text.KV {
	t.Helper()
	alg, _ := strconv.Atoi(get(challenge, "CHAP_A"))
	id, _ := strconv.Atoi(get(challenge, "CHAP_I"))
	c, err := DecodeBinary(get(challenge, "CHAP_C"))
	if err != nil {
		t.Fatal(err)
	}
	return kv("CHAP_N", user, "CHAP_R", EncodeBinary(Response(alg, byte(id), secret, c)))
}

func TestOneWay(t *testing.T) {
	for _, alg := range []string{"5", "7", "7,5", "6,5"} {
		tg := &Target{Incoming: Credentials{"alice", "alice-secret-1"}}
		ch, err := tg.Step(kv("CHAP_A", alg))
		if err != nil {
			t.Fatal(err)
		}
		if a := get(ch, "CHAP_A"); a != string(alg[0]) && !(alg == "6,5" && a == "5") {
			t.Errorf("CHAP_A=%s offered, target chose %s", alg, a)
		}
		if _, err := tg.Step(initiatorAnswer(t, ch, "alice", "alice-secret-1")); err != nil || !tg.Done {
			t.Fatalf("alg %s: right secret refused: %v", alg, err)
		}
	}
	tg := &Target{Incoming: Credentials{"alice", "alice-secret-1"}}
	ch, _ := tg.Step(kv("CHAP_A", "5"))
	if _, err := tg.Step(initiatorAnswer(t, ch, "alice", "wrong-secret")); !errors.Is(err, ErrFailed) {
		t.Fatalf("wrong secret: %v", err)
	}
	tg = &Target{Incoming: Credentials{"alice", "alice-secret-1"}}
	ch, _ = tg.Step(kv("CHAP_A", "5"))
	if _, err := tg.Step(initiatorAnswer(t, ch, "mallory", "alice-secret-1")); !errors.Is(err, ErrFailed) {
		t.Fatalf("wrong user: %v", err)
	}
	tg = &Target{Incoming: Credentials{"alice", "alice-secret-1"}}
	if _, err := tg.Step(kv("CHAP_A", "6")); !errors.Is(err, ErrFailed) {
		t.Fatalf("unsupported algorithm only: %v", err)
	}
}

func TestMutualAndReflection(t *testing.T) {
	tg := &Target{Incoming: Credentials{"alice", "alice-secret-1"}, Outgoing: &Credentials{"tgt", "target-secret-2"}}
	ch, _ := tg.Step(kv("CHAP_A", "5"))
	myChallenge := []byte("0123456789abcdef")
	ans := append(initiatorAnswer(t, ch, "alice", "alice-secret-1"), kv("CHAP_I", "77", "CHAP_C", EncodeBinary(myChallenge))...)
	r, err := tg.Step(ans)
	if err != nil {
		t.Fatal(err)
	}
	rr, _ := DecodeBinary(get(r, "CHAP_R"))
	if get(r, "CHAP_N") != "tgt" || !bytes.Equal(rr, Response(MD5, 77, "target-secret-2", myChallenge)) {
		t.Fatalf("mutual answer %v", r)
	}
	// Reflection: the initiator sends the target's own challenge back.
	tg = &Target{Incoming: Credentials{"alice", "alice-secret-1"}, Outgoing: &Credentials{"tgt", "target-secret-2"}}
	ch, _ = tg.Step(kv("CHAP_A", "5"))
	ans = append(initiatorAnswer(t, ch, "alice", "alice-secret-1"), kv("CHAP_I", "1", "CHAP_C", get(ch, "CHAP_C"))...)
	if _, err := tg.Step(ans); !errors.Is(err, ErrFailed) {
		t.Fatalf("reflected challenge accepted: %v", err)
	}
	// Mutual asked of a target without credentials.
	tg = &Target{Incoming: Credentials{"alice", "alice-secret-1"}}
	ch, _ = tg.Step(kv("CHAP_A", "5"))
	ans = append(initiatorAnswer(t, ch, "alice", "alice-secret-1"), kv("CHAP_I", "1", "CHAP_C", "0x0102")...)
	if _, err := tg.Step(ans); !errors.Is(err, ErrFailed) {
		t.Fatalf("mutual without target credentials: %v", err)
	}
}

// TestGoldenLinuxCHAP checks our CHAP response function against the
// exchange open-iscsi and LIO had in iscsi-tcp-chap.pcap (user golden-user,
// secret golden-secret-1).
func TestGoldenLinuxCHAP(t *testing.T) {
	pdus, err := pcaptest.ISCSIPDUs(filepath.Join(pcaptest.Dir(t), "iscsi-tcp-chap.pcap"), 3260)
	if err != nil {
		t.Fatal(err)
	}
	var id, challenge, resp string
	for _, p := range pdus {
		if p.BHS[0]&0x3f != 0x03 && p.BHS[0]&0x3f != 0x23 {
			continue
		}
		kvs, err := text.Parse(p.Data)
		if err != nil {
			t.Fatalf("frame %d: %v", p.Frame, err)
		}
		if v := get(kvs, "CHAP_I"); v != "" {
			id = v
		}
		if v := get(kvs, "CHAP_C"); v != "" {
			challenge = v
		}
		if v := get(kvs, "CHAP_R"); v != "" {
			resp = v
		}
	}
	if challenge != "0xb073a389bb4852a3c8ae20e8beb66e0d" || resp == "" {
		t.Fatalf("capture: CHAP_I %q CHAP_C %q CHAP_R %q", id, challenge, resp)
	}
	n, _ := strconv.Atoi(id)
	c, _ := DecodeBinary(challenge)
	r, _ := DecodeBinary(resp)
	if got := Response(MD5, byte(n), "golden-secret-1", c); !bytes.Equal(got, r) {
		t.Fatalf("our CHAP_R %x, Linux sent %x", got, r)
	}
}

func FuzzCHAP(f *testing.F) {
	f.Add([]byte("CHAP_A=5\x00"), []byte("CHAP_N=alice\x00CHAP_R=0x00\x00CHAP_I=1\x00CHAP_C=0b AAAA\x00"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		tg := &Target{Incoming: Credentials{"alice", "alice-secret-1"}, Outgoing: &Credentials{"tgt", "target-secret-2"}}
		for _, in := range [][]byte{a, b} {
			kvs, err := text.Parse(in)
			if err != nil {
				return
			}
			if _, err := tg.Step(kvs); err != nil {
				return
			}
		}
		if tg.Done {
			t.Fatal("fuzzed exchange authenticated without the secret")
		}
	})
}
