package text

import (
	"fmt"
	"slices"
	"strings"
)

// Special answer values (RFC 7143 §6.2).
const (
	NotUnderstood = "NotUnderstood"
	Irrelevant    = "Irrelevant"
	Reject        = "Reject"
)

// Negotiator answers a peer's offers from the key table and this side's
// preferences, and keeps the resulting operational values. One Negotiator
// serves one connection's login (and later its text negotiations).
type Negotiator struct {
	keys    map[string]*Key
	local   map[string]string // this side's preferred values
	values  map[string]string // current values, starting at the defaults
	peer    map[string]string // the peer's declarations
	offered map[string]bool   // keys the peer has offered in this negotiation
	leading bool
	// redeclared are identity keys declared again unchanged (Redeclared).
	redeclared []string
}

// NewNegotiator returns a negotiator. local holds this side's values: for
// List keys an acceptable comma-separated list, for boolean and numerical
// keys the value this side would choose on its own. leading tells whether
// the connection is the session's leading one.
func NewNegotiator(local map[string]string, leading bool) *Negotiator {
	n := &Negotiator{
		keys:    map[string]*Key{},
		local:   map[string]string{},
		values:  map[string]string{},
		peer:    map[string]string{},
		offered: map[string]bool{},
		leading: leading,
	}
	for _, k := range Keys() {
		k := k
		n.keys[k.Name] = &k
		if k.Default != "" {
			n.values[k.Name] = k.Default
		}
	}
	for k, v := range local {
		n.local[k] = v
	}
	return n
}

// Lookup returns the table entry of a key.
func (n *Negotiator) Lookup(name string) (*Key, bool) {
	k, ok := n.keys[name]
	return k, ok
}

// Value returns the current value of key: negotiated, or the default.
func (n *Negotiator) Value(key string) string { return n.values[key] }

// Set records a value decided outside Respond (for example the security
// stage's AuthMethod).
func (n *Negotiator) Set(key, value string) { n.values[key] = value }

// Peer returns the peer's declaration of key, if it made one.
func (n *Negotiator) Peer(key string) (string, bool) {
	v, ok := n.peer[key]
	return v, ok
}

// Offered reports whether the peer offered key during this negotiation.
func (n *Negotiator) Offered(key string) bool { return n.offered[key] }

// Context says where offers are being answered.
type Context struct {
	Login bool // in login (false: Text request in full feature phase)
}

// ErrRepeated reports a key offered twice in one negotiation, which RFC
// 7143 §6.1 forbids.
type ErrRepeated struct{ Key string }

func (e *ErrRepeated) Error() string {
	return fmt.Sprintf("iscsi text: key %s offered more than once (RFC 7143 §6.1)", e.Key)
}

// identityKeys are the declarations that name the session (RFC 7143
// §13.4, §13.5, §13.21): the only keys a peer may repeat, and only with
// the value it declared first.
func identityKey(name string) bool {
	switch name {
	case "InitiatorName", "SessionType", "TargetName":
		return true
	}
	return false
}

// Redeclared lists the identity keys the peer declared again with the same
// value (tolerated; see Respond), for a log line naming the quirk.
func (n *Negotiator) Redeclared() []string { return n.redeclared }

// Respond answers the peer's offers. Auth keys are skipped (the security
// stage handles them). It returns the answers in offer order. An error
// means the negotiation must fail (a repeated key).
func (n *Negotiator) Respond(offers []KV, ctx Context) ([]KV, error) {
	var out []KV
	// RDMAExtensions decides whether the iSER keys of the same PDU are
	// relevant (RFC 5046 §6), and open-iscsi sends it after them: answer
	// it first.
	for i, kv := range offers {
		if kv.Key == "RDMAExtensions" && i > 0 {
			re := make([]KV, 0, len(offers))
			re = append(re, kv)
			re = append(re, offers[:i]...)
			offers = append(re, offers[i+1:]...)
			break
		}
	}
	for _, kv := range offers {
		k, ok := n.keys[kv.Key]
		if !ok {
			// RFC 7143 §6.2: unknown keys, including X- and X# extension
			// keys we do not implement, are answered NotUnderstood.
			out = append(out, KV{kv.Key, NotUnderstood})
			continue
		}
		if k.Kind == Auth {
			continue
		}
		switch kv.Value {
		case NotUnderstood, Irrelevant, Reject:
			// An answer to an offer of ours; we make none but declarations.
			continue
		}
		if n.offered[kv.Key] {
			if identityKey(kv.Key) && n.peer[kv.Key] == kv.Value {
				// libiscsi declares these again, unchanged, in a later
				// login PDU when it holds CHAP credentials the target
				// did not ask for; tgt and LIO let it in. Nothing is
				// negotiated by a declaration: accepted, and reported.
				if !slices.Contains(n.redeclared, kv.Key) {
					n.redeclared = append(n.redeclared, kv.Key)
				}
				continue
			}
			return nil, &ErrRepeated{kv.Key}
		}
		n.offered[kv.Key] = true
		if ans, ok := n.answer(k, kv.Value, ctx); ok {
			out = append(out, KV{kv.Key, ans})
		}
	}
	return out, nil
}

func maxLen(k *Key) int {
	if k.MaxLen > 0 {
		return k.MaxLen
	}
	return 255
}

// answer returns the answer for one offer and whether one is sent.
func (n *Negotiator) answer(k *Key, v string, ctx Context) (string, bool) {
	if len(v) > maxLen(k) {
		return Reject, true
	}
	switch {
	case ctx.Login && k.Phase == FullFeatureOnly:
		return Irrelevant, true
	case !ctx.Login && k.Phase == InitializeOnly:
		return Reject, true
	case k.Scope == LeadingOnly && !n.leading:
		return Irrelevant, true
	case k.ISER && n.values["RDMAExtensions"] != "Yes":
		return Irrelevant, true
	}
	switch k.Kind {
	case Declarative:
		if len(k.Values) > 0 && !contains(k.Values, v) {
			return Reject, true
		}
		n.peer[k.Name] = v
		if k.Name == "IFMarkInt" || k.Name == "OFMarkInt" {
			// Irrelevant whenever markers are off, which they always are.
			return Irrelevant, true
		}
		return "", false
	case NumDecl:
		num, err := ParseNumber(v)
		if err != nil || num < k.Min || num > k.Max {
			return Reject, true
		}
		n.peer[k.Name] = v
		return "", false
	case BoolAnd, BoolOr:
		if v != "Yes" && v != "No" {
			return Reject, true
		}
		mine := n.localOr(k)
		var res bool
		if k.Kind == BoolAnd {
			res = v == "Yes" && mine == "Yes"
		} else {
			res = v == "Yes" || mine == "Yes"
		}
		r := "No"
		if res {
			r = "Yes"
		}
		n.values[k.Name] = r
		return r, true
	case NumMin, NumMax:
		num, err := ParseNumber(v)
		if err != nil || num < k.Min || num > k.Max {
			return Reject, true
		}
		mine, _ := ParseNumber(n.localOr(k))
		res := num
		if (k.Kind == NumMin && mine < num) || (k.Kind == NumMax && mine > num) {
			res = mine
		}
		r := fmt.Sprint(res)
		n.values[k.Name] = r
		return r, true
	case List:
		acceptable := strings.Split(n.localOr(k), ",")
		for _, cand := range strings.Split(v, ",") {
			if contains(acceptable, cand) && (len(k.Values) == 0 || contains(k.Values, cand)) {
				n.values[k.Name] = cand
				return cand, true
			}
		}
		return Reject, true
	}
	return NotUnderstood, true
}

func (n *Negotiator) localOr(k *Key) string {
	if v, ok := n.local[k.Name]; ok {
		return v
	}
	return k.Default
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Number returns a numerical value (negotiated, declared by the peer for
// NumDecl keys, or the default).
func (n *Negotiator) Number(key string) uint64 {
	v := n.values[key]
	if k, ok := n.keys[key]; ok && k.Kind == NumDecl {
		if p, ok := n.peer[key]; ok {
			v = p
		}
	}
	num, _ := ParseNumber(v)
	return num
}

// Bool returns a boolean value.
func (n *Negotiator) Bool(key string) bool { return n.values[key] == "Yes" }

// Settle is the offering side of a negotiation (RFC 7143 §6.2): the value
// key k takes when this side offered offer and the peer answered answer.
// NotUnderstood, Irrelevant and Reject leave the key at its default. The
// responder answers with the result of the key's function (§6.2.2), so an
// answer no result could be — a boolean that is not Yes or No or that the
// function would not give (No to a Yes offered for an OR key), a number
// outside the key's range or past the offer (above it for a key that takes
// the minimum), a list item that was not offered — is an error, and the
// login must fail rather than run on values the two sides disagree on.
// Declarations are not answers: Settle returns them as they are.
func Settle(k Key, offer, answer string) (string, error) {
	switch answer {
	case NotUnderstood, Irrelevant, Reject:
		return k.Default, nil
	}
	bad := func(why string) error {
		return &Error{Rule: "§6.2.2", Msg: fmt.Sprintf("the answer %s=%q to our %q is %s", k.Name, truncate([]byte(answer)), offer, why)}
	}
	switch k.Kind {
	case BoolAnd, BoolOr:
		if answer != "Yes" && answer != "No" {
			return "", bad("not a boolean")
		}
		res := answer == "Yes" && offer == "Yes"
		if k.Kind == BoolOr {
			res = answer == "Yes" || offer == "Yes"
		}
		if res != (answer == "Yes") {
			return "", bad("not the result of the key's function")
		}
	case NumMin, NumMax:
		num, err := ParseNumber(answer)
		if err != nil || num < k.Min || num > k.Max {
			return "", bad(fmt.Sprintf("outside %d to %d", k.Min, k.Max))
		}
		mine, err := ParseNumber(offer)
		if err == nil && (k.Kind == NumMin && num > mine || k.Kind == NumMax && num < mine) {
			return "", bad("past the offer")
		}
	case List:
		if !contains(strings.Split(offer, ","), answer) {
			return "", bad("not one of the values offered")
		}
	}
	return answer, nil
}
