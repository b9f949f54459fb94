// Package nodetest starts a node for a test: what the node package's own
// tests and the command's tests share.
package nodetest

import (
	"context"
	"testing"
	"time"

	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/node"
)

// Start builds and starts a node from cfg and opts; the test's cleanup
// shuts it down (10 s at most).
func Start(t testing.TB, cfg *config.Config, opts node.Options) *node.Node {
	t.Helper()
	n, err := node.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.Shutdown(ctx)
	})
	return n
}

// Portal is the address of the node's first portal of the transport
// ("iscsi", "iser", "srp", …); the test fails without one.
func Portal(t testing.TB, n *node.Node, transport string) string {
	t.Helper()
	for _, p := range n.Portals() {
		if p.Transport == transport {
			return p.Address
		}
	}
	t.Fatalf("no %s portal in %v", transport, n.Portals())
	return ""
}
