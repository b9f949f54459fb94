//go:build !(verbs && linux && cgo)

package verbs

import (
	"context"
	"errors"

	"github.com/blockwire/blockwire/rdma"
)

// Supported reports whether this build has the verbs device.
const Supported = false

// ErrNotBuilt is what this build answers: it has no verbs device.
var ErrNotBuilt = errors.New("verbs: this blockwire was built without RDMA hardware support (build with -tags verbs and rdma-core's libibverbs-dev and librdmacm-dev)")

// Devices lists the kernel's RDMA devices; this build cannot.
func Devices() ([]Info, error) { return nil, ErrNotBuilt }

// DeviceFor names the kernel RDMA device an address belongs to; this
// build knows of none.
func DeviceFor(string) (string, error) { return "", nil }

// Device is a kernel RDMA device; this build never opens one.
type Device struct{}

// Open fails in this build.
func Open(string, Options) (*Device, error) { return nil, ErrNotBuilt }

// The methods of the tagged build's Device, unreachable here (Open fails).

func (*Device) Name() string        { return "" }
func (*Device) Info() Info          { return Info{} }
func (*Device) PD() *rdma.PD        { return nil }
func (*Device) Memory() rdma.Memory { return nil }
func (*Device) Close() error        { return nil }
func (*Device) Listen(string) (rdma.Listener, error) {
	return nil, ErrNotBuilt
}
func (*Device) Dial(context.Context, string, rdma.ConnParams) (rdma.QP, []byte, error) {
	return nil, nil, ErrNotBuilt
}
