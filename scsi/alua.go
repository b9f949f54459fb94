package scsi

import (
	"fmt"
	"strconv"
	"strings"
)

// ALUAState is a target port group's asymmetric access state (SPC-4
// §5.15.2, table 154).
type ALUAState uint8

// Access states.
const (
	ActiveOptimized    ALUAState = 0x0
	ActiveNonOptimized ALUAState = 0x1
	Standby            ALUAState = 0x2
	Unavailable        ALUAState = 0x3
)

// names are a state's names as configurations write them, the first the
// one String prints.
func (s ALUAState) names() []string {
	switch s {
	case ActiveOptimized:
		return []string{"active-optimized", "ao"}
	case ActiveNonOptimized:
		return []string{"active-non-optimized", "ano"}
	case Standby:
		return []string{"standby"}
	case Unavailable:
		return []string{"unavailable"}
	}
	return nil
}

func (s ALUAState) String() string {
	if n := s.names(); n != nil {
		return n[0]
	}
	return fmt.Sprintf("state %#x", uint8(s))
}

// PortGroup is a target port group: its identifier (also the relative
// target port identifier of its one port) and access state.
type PortGroup struct {
	ID    uint16
	State ALUAState
}

// ParsePortGroup reads "ID=state", state one of active-optimized (ao),
// active-non-optimized (ano), standby, unavailable.
func ParsePortGroup(s string) (PortGroup, error) {
	id, st, ok := strings.Cut(s, "=")
	if !ok {
		return PortGroup{}, fmt.Errorf("port group %q: want ID=state", s)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(id), 10, 16)
	if err != nil || n == 0 {
		return PortGroup{}, fmt.Errorf("port group %q: the ID is a number from 1 to 65535", s)
	}
	st = strings.ToLower(strings.TrimSpace(st))
	for state := ActiveOptimized; state <= Unavailable; state++ {
		for _, name := range state.names() {
			if st == name {
				return PortGroup{ID: uint16(n), State: state}, nil
			}
		}
	}
	return PortGroup{}, fmt.Errorf("port group %q: state is active-optimized, active-non-optimized, standby or unavailable", s)
}
