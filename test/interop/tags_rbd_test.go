//go:build rbd

package interop

// buildTags: the RBD tests need a blockwire with Ceph RBD support.
const buildTags = "rbd"
