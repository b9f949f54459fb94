package text

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParseAppend(t *testing.T) {
	kvs := []KV{{"InitiatorName", "iqn.2004-10.org.guestlab:initiator"}, {"SessionType", "Normal"}, {"X-com.example.key", ""}}
	b := Append(nil, kvs...)
	b = append(b, 0, 0) // padding nulls are tolerated
	got, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, kvs) {
		t.Fatalf("got %v", got)
	}
	for _, bad := range []string{"NoEquals\x00", "Key=unterminated", "=value\x00", "Bad Key=x\x00", strings.Repeat("K", 64) + "=v\x00", "A=b\x00\x00C=d\x00"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestParseNumber(t *testing.T) {
	for s, want := range map[string]uint64{"0": 0, "262144": 262144, "0x10": 16, "0X1f": 31} {
		if n, err := ParseNumber(s); err != nil || n != want {
			t.Errorf("ParseNumber(%q) = %d, %v", s, n, err)
		}
	}
	for _, s := range []string{"", "1_000", "-1", "0b1", "0o7", "12a", "0x"} {
		if _, err := ParseNumber(s); err == nil {
			t.Errorf("ParseNumber(%q) accepted", s)
		}
	}
}

// linuxOffer is what open-iscsi sends for a normal session (captures
// README, iscsi-tcp.pcap).
var linuxOffer = []KV{
	{"InitiatorName", "iqn.2004-10.org.guestlab:initiator"}, {"InitiatorAlias", "guestlab"},
	{"TargetName", "iqn.2003-01.org.linux-iscsi.guestlab:t1"}, {"SessionType", "Normal"},
	{"HeaderDigest", "None"}, {"DataDigest", "None"}, {"DefaultTime2Wait", "2"}, {"DefaultTime2Retain", "0"},
	{"IFMarker", "No"}, {"OFMarker", "No"}, {"ErrorRecoveryLevel", "0"}, {"InitialR2T", "No"},
	{"ImmediateData", "Yes"}, {"MaxBurstLength", "16776192"}, {"FirstBurstLength", "262144"},
	{"MaxOutstandingR2T", "1"}, {"MaxConnections", "1"}, {"DataPDUInOrder", "Yes"},
	{"DataSequenceInOrder", "Yes"}, {"MaxRecvDataSegmentLength", "262144"},
}

func TestNegotiateLinuxOffer(t *testing.T) {
	n := NewNegotiator(map[string]string{
		"HeaderDigest": "CRC32C,None", "InitialR2T": "Yes", "MaxBurstLength": "262144",
		"FirstBurstLength": "65536", "MaxConnections": "8", "DefaultTime2Retain": "20",
	}, true)
	ans, err := n.Respond(linuxOffer, Context{Login: true})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range ans {
		got[kv.Key] = kv.Value
	}
	want := map[string]string{
		"HeaderDigest": "None", "DataDigest": "None", "DefaultTime2Wait": "2", "DefaultTime2Retain": "0",
		"IFMarker": "No", "OFMarker": "No", "ErrorRecoveryLevel": "0", "InitialR2T": "Yes",
		"ImmediateData": "Yes", "MaxBurstLength": "262144", "FirstBurstLength": "65536",
		"MaxOutstandingR2T": "1", "MaxConnections": "1", "DataPDUInOrder": "Yes", "DataSequenceInOrder": "Yes",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("answers\n got %v\nwant %v", got, want)
	}
	if n.Number("MaxRecvDataSegmentLength") != 262144 {
		t.Errorf("peer's MaxRecvDataSegmentLength not recorded")
	}
	if !n.Bool("InitialR2T") || n.Number("MaxBurstLength") != 262144 {
		t.Errorf("results not kept")
	}
}

func TestNegotiateSpecialAnswers(t *testing.T) {
	n := NewNegotiator(nil, true)
	ans, err := n.Respond([]KV{
		{"X-vendor.thing", "1"},                 // unknown: NotUnderstood
		{"MaxBurstLength", "100"},               // below 512: Reject
		{"InitialR2T", "Maybe"},                 // not a boolean: Reject
		{"SendTargets", "All"},                  // full-feature only, in login: Irrelevant
		{"HeaderDigest", "MD5"},                 // nothing acceptable: Reject
		{"TargetRecvDataSegmentLength", "8192"}, // iSER key without RDMAExtensions=Yes
	}, Context{Login: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []KV{{"X-vendor.thing", NotUnderstood}, {"MaxBurstLength", Reject}, {"InitialR2T", Reject},
		{"SendTargets", Irrelevant}, {"HeaderDigest", Reject},
		{"TargetRecvDataSegmentLength", Irrelevant}}
	if !reflect.DeepEqual(ans, want) {
		t.Fatalf("got %v\nwant %v", ans, want)
	}
	nl := NewNegotiator(nil, false)
	if ans, _ := nl.Respond([]KV{{"ErrorRecoveryLevel", "1"}}, Context{Login: true}); !reflect.DeepEqual(ans, []KV{{"ErrorRecoveryLevel", Irrelevant}}) {
		t.Errorf("leading-only key on a secondary connection: got %v", ans)
	}
	if _, err := n.Respond([]KV{{"MaxRecvDataSegmentLength", "8192"}, {"MaxRecvDataSegmentLength", "8192"}}, Context{Login: true}); err == nil {
		t.Fatal("repeated key accepted")
	}
}

func TestISERKeysRegistered(t *testing.T) {
	n := NewNegotiator(map[string]string{"RDMAExtensions": "Yes"}, true)
	ans, err := n.Respond([]KV{{"RDMAExtensions", "Yes"}, {"InitiatorRecvDataSegmentLength", "262144"}, {"MaxOutstandingUnexpectedPDUs", "0"}}, Context{Login: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(ans) != 1 || ans[0] != (KV{"RDMAExtensions", "Yes"}) {
		t.Fatalf("got %v", ans)
	}
	if n.Number("InitiatorRecvDataSegmentLength") != 262144 {
		t.Fatal("InitiatorRecvDataSegmentLength not recorded")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(Append(nil, linuxOffer...))
	f.Add([]byte("A=\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		kvs, err := Parse(b)
		if err != nil {
			return
		}
		// Whatever parses must survive a round trip.
		again, err := Parse(Append(nil, kvs...))
		if err != nil || !reflect.DeepEqual(again, kvs) {
			t.Fatalf("round trip changed %v to %v (%v)", kvs, again, err)
		}
	})
}

func FuzzNegotiate(f *testing.F) {
	f.Add(Append(nil, linuxOffer...), true, true)
	f.Fuzz(func(t *testing.T, b []byte, leading, login bool) {
		kvs, err := Parse(b)
		if err != nil {
			return
		}
		n := NewNegotiator(map[string]string{"HeaderDigest": "CRC32C,None"}, leading)
		ans, err := n.Respond(kvs, Context{Login: login})
		if err != nil {
			return
		}
		offered := map[string]string{}
		for _, kv := range kvs {
			offered[kv.Key] = kv.Value
		}
		for _, a := range ans {
			if len(a.Value) > 255 {
				t.Fatalf("answer %s of %d bytes", a.Key, len(a.Value))
			}
			// What we answer, the offering side accepts (Settle).
			if k, ok := n.Lookup(a.Key); ok {
				if _, err := Settle(*k, offered[a.Key], a.Value); err != nil {
					t.Fatalf("our answer %s=%s to %q: %v", a.Key, a.Value, offered[a.Key], err)
				}
			}
		}
	})
}

// TestSettle: the offering side's check of an answer (RFC 7143 §6.2.2).
func TestSettle(t *testing.T) {
	key := func(name string) Key {
		n := NewNegotiator(nil, true)
		k, ok := n.Lookup(name)
		if !ok {
			t.Fatalf("no key %s", name)
		}
		return *k
	}
	for _, tc := range []struct {
		key, offer, answer, want string // want "": an error
	}{
		{"ImmediateData", "Yes", "No", "No"}, // AND
		{"ImmediateData", "No", "Yes", ""},
		{"ImmediateData", "Yes", "Reject", "Yes"}, // the default
		{"InitialR2T", "No", "Yes", "Yes"},        // OR
		{"InitialR2T", "Yes", "No", ""},
		{"InitialR2T", "No", "Maybe", ""},
		{"MaxBurstLength", "262144", "65536", "65536"}, // min
		{"MaxBurstLength", "65536", "262144", ""},
		{"MaxBurstLength", "65536", "0x100", ""}, // 256: below the range
		{"DefaultTime2Wait", "2", "5", "5"},      // max
		{"DefaultTime2Wait", "2", "1", ""},
		{"HeaderDigest", "CRC32C,None", "None", "None"},
		{"HeaderDigest", "None", "CRC32C", ""},
		{"MaxRecvDataSegmentLength", "8192", "262144", "262144"}, // a declaration
	} {
		got, err := Settle(key(tc.key), tc.offer, tc.answer)
		if tc.want == "" {
			if err == nil {
				t.Errorf("%s: %s answered %s: accepted as %s", tc.key, tc.offer, tc.answer, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %s answered %s: %q, %v; want %q", tc.key, tc.offer, tc.answer, got, err, tc.want)
		}
	}
}

func BenchmarkNegotiateLinuxOffer(b *testing.B) {
	data := Append(nil, linuxOffer...)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		kvs, err := Parse(data)
		if err != nil {
			b.Fatal(err)
		}
		n := NewNegotiator(map[string]string{"HeaderDigest": "CRC32C,None"}, true)
		if _, err := n.Respond(kvs, Context{Login: true}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRepeatedIdentityKey: libiscsi (and QEMU through it) declares
// InitiatorName again in a later login PDU, with the same value, when it
// holds CHAP credentials the target did not ask for. That one leniency is
// granted — InitiatorName, SessionType or TargetName repeated with the
// identical value — and reported; a different value, or a repeated
// negotiated key, is still the error RFC 7143 §6.1 makes it.
func TestRepeatedIdentityKey(t *testing.T) {
	n := NewNegotiator(nil, true)
	first := []KV{{"InitiatorName", "iqn.2026-11.org.example:h"}, {"SessionType", "Normal"}, {"TargetName", "iqn.2026-11.org.example:t"}}
	if _, err := n.Respond(first, Context{Login: true}); err != nil {
		t.Fatal(err)
	}
	ans, err := n.Respond(append(slices.Clone(first), KV{"HeaderDigest", "None"}), Context{Login: true})
	if err != nil || !reflect.DeepEqual(ans, []KV{{"HeaderDigest", "None"}}) {
		t.Fatalf("identity keys repeated with the same values: %v, %v", ans, err)
	}
	if got := n.Redeclared(); !reflect.DeepEqual(got, []string{"InitiatorName", "SessionType", "TargetName"}) {
		t.Errorf("Redeclared: %v", got)
	}
	for _, kv := range []KV{{"InitiatorName", "iqn.2026-11.org.example:other"}, {"TargetName", "iqn.2026-11.org.example:u"}, {"HeaderDigest", "None"}} {
		if _, err := n.Respond([]KV{kv}, Context{Login: true}); err == nil {
			t.Errorf("%s=%s repeated: accepted", kv.Key, kv.Value)
		}
	}
}
