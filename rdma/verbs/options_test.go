package verbs

import (
	"strings"
	"testing"
)

// TestWindowsNotUsedOnRxe: rxe repeats memory window binds when it
// retransmits, so its windows are never used; a device with windows and
// another vendor ID uses them, one without has none to use.
func TestWindowsNotUsedOnRxe(t *testing.T) {
	for _, c := range []struct {
		info Info
		want bool
		says string
	}{
		{Info{Name: "rxe0", MemoryWindows: true, VendorID: 0xFFFFFF}, false, "memory windows, not used (rxe repeats"},
		{Info{Name: "mlx5_0", MemoryWindows: true, VendorID: 0x02c9}, true, ", memory windows"},
		{Info{Name: "siw0", VendorID: 0x626d74}, false, "no memory windows"},
	} {
		if got := c.info.WindowsUsable(); got != c.want {
			t.Errorf("%s: WindowsUsable() = %v, want %v", c.info.Name, got, c.want)
		}
		if s := c.info.String(); !strings.Contains(s, c.says) {
			t.Errorf("%s: %q does not say %q", c.info.Name, s, c.says)
		}
	}
}
