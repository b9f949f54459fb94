//go:build verbs && linux && cgo

package verbs

import (
	"os"
	"strings"
	"testing"
)

// On a machine without RDMA devices (CI's host; the guest lab has them)
// the verbs build says so clearly and falls back to nothing silently.
func TestNoDeviceIsClear(t *testing.T) {
	devs, err := Devices()
	if _, serr := os.Stat("/dev/infiniband"); serr == nil {
		// A machine with RDMA devices (the guest lab) lists them.
		if err != nil {
			t.Fatalf("Devices with /dev/infiniband present: %v", err)
		}
		return
	}
	if err == nil && len(devs) != 0 {
		t.Fatalf("devices listed without /dev/infiniband: %v", devs)
	}
	_, err = Open("rxe0", Options{})
	if err == nil || !strings.Contains(err.Error(), "RDMA device") && !strings.Contains(err.Error(), "rdma_get_devices") {
		t.Fatalf("Open on a machine without devices: %v", err)
	}
	if name, _ := DeviceFor("127.0.0.1:3260"); name != "" {
		t.Fatalf("DeviceFor found %q", name)
	}
}
