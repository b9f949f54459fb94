//go:build !rbd

package node

import (
	"errors"
	"log/slog"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/config"
)

// openRBD: this build has no librbd (the default build is pure Go).
func openRBD(lc config.LUN, log *slog.Logger) (backend.Backend, error) {
	return nil, errors.New("rbd " + lc.RBD + ": this blockwire was built without Ceph RBD support; build it with cgo, Debian's librbd-dev and librados-dev, and -tags rbd")
}
