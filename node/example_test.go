package node_test

import (
	"context"
	"fmt"

	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/node"
)

// A target with a 64 MiB in-memory LUN, embedded in a program: the whole
// blockwire node, assembled from a configuration.
func Example() {
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, Targets: []config.Target{{
		Name: "iqn.2026-11.org.example:disk", LUNs: []config.LUN{{ID: 0, Size: "64MiB"}}}}}
	n, err := node.New(cfg, node.Options{})
	if err != nil {
		panic(err)
	}
	if err := n.Start(); err != nil {
		panic(err)
	}
	defer n.Shutdown(context.Background())

	// Any iSCSI initiator can now log in; here, blockwire's own.
	portal := n.Portals()[0].Address
	d, err := initiator.Open(context.Background(), "iscsi://"+portal+"/iqn.2026-11.org.example:disk/0", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		panic(err)
	}
	defer d.Close()
	fmt.Println(d.Size(), n.Sessions()[0].Fabric)
	// Output: 67108864 iscsi
}
