package rbd

import "fmt"

// This file builds without the rbd tag: configurations name RBD images
// in every build, and the parser of their names is fuzzed in every build.

// ParseSpec splits "pool/image" or "pool/namespace/image".
func ParseSpec(s string) (pool, namespace, image string, err error) {
	var parts []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	parts = append(parts, s[start:])
	switch len(parts) {
	case 2:
		pool, image = parts[0], parts[1]
	case 3:
		pool, namespace, image = parts[0], parts[1], parts[2]
	default:
		return "", "", "", fmt.Errorf("rbd: %q is not pool/image or pool/namespace/image", s)
	}
	if pool == "" || image == "" {
		return "", "", "", fmt.Errorf("rbd: %q is not pool/image or pool/namespace/image", s)
	}
	return pool, namespace, image, nil
}
