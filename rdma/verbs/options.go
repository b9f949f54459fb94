// Package verbs is an RDMA device behind blockwire's rdma API backed by
// rdma-core (libibverbs and librdmacm) through cgo: kernel RDMA devices —
// RDMA NICs (ConnectX, Chelsio, Broadcom, …) and the kernel's own rxe and
// siw — for iSER and SRP where they are deployed. It is built with the
// "verbs" build tag (go build -tags verbs; rdma-core's development files
// and a C compiler needed); without it, the package reports that this
// build has no verbs device and blockwire stays pure Go.
//
// What maps to what:
//   - a Device is one ibv_context (by name, as rdma link and ibv_devices
//     list them), one protection domain and its registered memory;
//   - memory is registered in chunks outside the Go heap (memory.go) and
//     pooled; buffers from it move by DMA with no copy, other buffers
//     through a bounce buffer from it (one copy);
//   - connections are librdmacm's, in the TCP port space that Linux
//     ib_iser, isert, ib_srp and ib_srpt use (service ID 0x0106<<16 |
//     port on InfiniBand and RoCE; the TCP port on iWARP), private data
//     as the consumer gives it;
//   - each queue pair has one completion queue with a completion channel
//     whose fd the Go runtime's poller waits on: no goroutine spins.
package verbs

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
)

// Options configure a Device.
type Options struct {
	// Remote registers the memory for the peer's RDMA Reads and Writes
	// too (an initiator's buffers, which the target reaches). A target
	// registers its memory for local access only: no peer can touch it.
	Remote bool
	// MaxMemory bounds the registered memory (default 256 MiB). Beyond
	// it, buffers come from the Go heap and move through a bounce buffer.
	MaxMemory int
	// Backlog bounds the connection requests a listener holds before they
	// are accepted (default 64); more are rejected.
	Backlog int
	Logger  *slog.Logger
}

func (o *Options) defaults() {
	if o.MaxMemory <= 0 {
		o.MaxMemory = 256 << 20
	}
	if o.Backlog <= 0 {
		o.Backlog = 64
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Info describes an RDMA device.
type Info struct {
	Name         string
	Kind         string // "RoCE", "iWARP", "InfiniBand"
	NodeGUID     uint64
	Ports        int
	State        string // of port 1: "active", "down", …
	MTU          int    // active MTU of port 1
	MaxReadDepth int    // RDMA Reads outstanding per queue pair
	Netdev       string // the network device under a RoCE or iWARP port
}

func (i Info) String() string {
	return fmt.Sprintf("%s %s port 1 %s mtu %d guid %016x netdev %s", i.Name, i.Kind, i.State, i.MTU, i.NodeGUID, i.Netdev)
}

func portState(s int) string {
	switch s {
	case 1:
		return "down"
	case 2:
		return "init"
	case 3:
		return "armed"
	case 4:
		return "active"
	case 5:
		return "active-defer"
	}
	return fmt.Sprintf("state %d", s)
}

// netdevOf is the network device of port 1 (sysfs; "" when none).
func netdevOf(dev string) string {
	b, err := os.ReadFile(filepath.Join("/sys/class/infiniband", dev, "ports/1/gid_attrs/ndevs/0"))
	if err != nil {
		return ""
	}
	return string(trimNL(b))
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == 0) {
		b = b[:len(b)-1]
	}
	return b
}
