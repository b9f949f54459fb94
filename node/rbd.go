//go:build rbd

package node

import (
	"log/slog"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/backend/rbd"
	"github.com/blockwire/blockwire/config"
)

// openRBD opens the Ceph RBD image a LUN names.
func openRBD(lc config.LUN, log *slog.Logger) (backend.Backend, error) {
	pool, ns, image, err := rbd.ParseSpec(lc.RBD)
	if err != nil {
		return nil, err
	}
	return rbd.Open(rbd.Config{ConfFile: lc.CephConf, Keyring: lc.CephKeyring, User: lc.CephUser,
		Pool: pool, Namespace: ns, Image: image, Logger: log})
}
