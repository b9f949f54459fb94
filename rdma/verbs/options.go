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
	"errors"
	"fmt"
	"log/slog"
)

// ErrDeviceRemoved is what a listener's Accept and a queue pair's Err
// wrap when the kernel removed the RDMA device (rdma link delete, a NIC
// reset or unplug).
var ErrDeviceRemoved = errors.New("RDMA device removed")

// Options configure a Device.
type Options struct {
	// Remote registers the memory for the peer's RDMA Reads and Writes
	// too (an initiator's buffers, which the target reaches). A target
	// registers its memory for local access only: no peer can touch it.
	Remote bool
	// Windows, with Remote, binds a memory window (type 2) over each
	// I/O's buffer on a device that has them, so a peer reaches only that
	// buffer and only until the I/O ends; the memory itself is then
	// registered for local access and binding only. Off, the peer reaches
	// Remote memory under its R_Key. Not used on rxe, whose windows break
	// when it retransmits (Info.WindowsUsable).
	Windows bool
	// MaxMemory bounds the registered memory (default 256 MiB). Beyond
	// it, buffers come from the Go heap and move through a bounce buffer.
	MaxMemory int
	// Backlog bounds the connection requests a listener holds before they
	// are accepted (default 64); more are rejected.
	Backlog int
	Logger  *slog.Logger
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
	// MemoryWindows: the device has type 2 memory windows.
	MemoryWindows bool
	// VendorID is the device's IEEE vendor ID (0xFFFFFF: the kernel's
	// rxe).
	VendorID uint32
}

// rxeVendorID is the vendor ID the kernel's rdma_rxe reports (its
// rxe_param.h: RXE_VENDOR_ID).
const rxeVendorID = 0xFFFFFF

// WindowsUsable reports whether the device's memory windows can carry
// I/O. rxe's cannot: when its requester goes back to retransmit
// (req_retry in rxe_req.c: a timeout or a NAK), it starts again at the
// oldest request not yet completed and executes every request from there
// once more — memory window binds and local invalidations included,
// though they were done already. A repeated bind finds its window bound
// and fails (IBV_WC_MW_BIND_ERR: the connection ends; seen in the guest
// lab's SRP runs against LIO), and a repeated invalidation of a window
// its peer already invalidated crashes the 6.1 kernel (rxe_invalidate_mw).
// Memory registration without windows is not affected.
func (i Info) WindowsUsable() bool {
	return i.MemoryWindows && i.VendorID != rxeVendorID
}

func (i Info) String() string {
	w := "no memory windows"
	switch {
	case i.WindowsUsable():
		w = "memory windows"
	case i.MemoryWindows:
		w = "memory windows, not used (rxe repeats window binds when it retransmits)"
	}
	return fmt.Sprintf("%s %s port 1 %s mtu %d guid %016x netdev %s, %s", i.Name, i.Kind, i.State, i.MTU, i.NodeGUID, i.Netdev, w)
}
