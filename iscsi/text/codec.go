// Package text is the iSCSI text-key codec and negotiation engine of RFC
// 7143 §6 and §13: key=value pairs in data segments, a declarative table of
// every RFC 7143 login/text key plus the iSER keys of RFC 5046 §6, and
// the result functions (AND, OR, Min, Max, list selection, declaration)
// with NotUnderstood / Irrelevant / Reject answers.
package text

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// Limits (RFC 7143 §6.1).
const (
	MaxKeyLen = 63
	// MaxValueLen bounds any value; binary CHAP values may be long, so the
	// per-key limit in the table is usually smaller (255).
	MaxValueLen = 8192
	// MaxTextLen bounds the text of one login or text exchange after
	// reassembly across PDUs with C=1.
	MaxTextLen = 64 * 1024
)

// KV is one key=value pair.
type KV struct {
	Key   string
	Value string
}

// Error is a malformed text segment.
type Error struct {
	Rule string
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("iscsi text: %s (RFC 7143 %s)", e.Msg, e.Rule) }

func validKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '-' || c == '+' || c == '@' || c == '_'
}

// Parse splits a data segment into pairs. Every pair must end with a NUL
// (RFC 7143 §6.1); trailing NUL padding is tolerated. Keys are checked
// for their character set and length.
func Parse(b []byte) ([]KV, error) {
	if len(b) > MaxTextLen {
		return nil, &Error{"§6.1", fmt.Sprintf("text of %d bytes exceeds the %d-byte limit", len(b), MaxTextLen)}
	}
	var out []KV
	for len(b) > 0 {
		end := bytes.IndexByte(b, 0)
		if end < 0 {
			return nil, &Error{"§6.1", "key=value pair not terminated by a null byte"}
		}
		pair := b[:end]
		b = b[end+1:]
		if len(pair) == 0 {
			// Padding after the last pair.
			if len(bytes.Trim(b, "\x00")) != 0 {
				return nil, &Error{"§6.1", "empty key=value pair"}
			}
			break
		}
		eq := bytes.IndexByte(pair, '=')
		if eq < 0 {
			return nil, &Error{"§6.1", fmt.Sprintf("pair %q has no '='", truncate(pair))}
		}
		k, v := pair[:eq], pair[eq+1:]
		if len(k) == 0 || len(k) > MaxKeyLen {
			return nil, &Error{"§6.1", fmt.Sprintf("key %q has length %d (1..%d allowed)", truncate(k), len(k), MaxKeyLen)}
		}
		for _, c := range k {
			if !validKeyChar(c) {
				return nil, &Error{"§6.1", fmt.Sprintf("key %q contains %q", truncate(k), c)}
			}
		}
		if len(v) > MaxValueLen {
			return nil, &Error{"§6.1", fmt.Sprintf("value of %s is %d bytes long", k, len(v))}
		}
		out = append(out, KV{string(k), string(v)})
	}
	return out, nil
}

func truncate(b []byte) string {
	if len(b) > 32 {
		return string(b[:32]) + "..."
	}
	return string(b)
}

// Append encodes pairs as key=value\0 sequences.
func Append(b []byte, kvs ...KV) []byte {
	for _, kv := range kvs {
		b = append(b, kv.Key...)
		b = append(b, '=')
		b = append(b, kv.Value...)
		b = append(b, 0)
	}
	return b
}

// ParseNumber parses a numerical value: decimal or 0x-prefixed hex (RFC
// 7143 §6.1: decimal-constant / hex-constant). Base64 (0b) numbers are
// allowed only for large-numerical-values, which no negotiated key uses.
func ParseNumber(s string) (uint64, error) {
	if s == "" {
		return 0, fmt.Errorf("empty number")
	}
	if len(s) > 2 && (s[:2] == "0x" || s[:2] == "0X") {
		for _, c := range s[2:] {
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return 0, fmt.Errorf("bad hex number %q", s)
			}
		}
		return strconv.ParseUint(s[2:], 16, 64)
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("bad decimal number %q", s)
		}
	}
	return strconv.ParseUint(s, 10, 64)
}
