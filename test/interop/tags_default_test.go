//go:build !rbd

package interop

// buildTags are the tags the blockwire binary under test is built with.
const buildTags = ""
