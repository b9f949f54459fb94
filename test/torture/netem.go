package main

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The network's own faults: Linux's netem queueing discipline (tc) on the
// devices between the initiators and the target — a veth pair whose far
// end is in the network namespace the target runs in (the guest lab's
// torture scenario sets it up; the host kernel of CI has no netem). The
// proxy's faults (proxy.go) stop and reset streams; these lose, reorder,
// delay and drop packets under TCP, which must recover on its own:
//
//   - "loss": 1–20% of the packets lost;
//   - "reorder": a quarter of them sent 10 ms early (the rest delayed);
//   - "jitter": 5–50 ms of delay, varying by up to as much again, so
//     packets overtake each other;
//   - "blackhole": every packet dropped (the effect of a firewall's DROP
//     rule on both directions), then the link back.
//
// Each lasts 0.3–3 s, on every device at once; then the devices get
// their plain queue back.

// NetFaults are the kinds netem injects (with Config.Netem).
var NetFaults = []string{"loss", "reorder", "jitter", "blackhole"}

// netDev is a device netem runs on: "dev" in this namespace or
// "dev@netns" in a named one.
type netDev struct{ name, ns string }

func parseNetDevs(list []string) ([]netDev, error) {
	var out []netDev
	for _, s := range list {
		name, ns, _ := strings.Cut(strings.TrimSpace(s), "@")
		if name == "" {
			return nil, fmt.Errorf("netem device %q: want dev or dev@netns", s)
		}
		out = append(out, netDev{name, ns})
	}
	return out, nil
}

// tc runs tc on d (in its namespace) with args.
func (d netDev) tc(args ...string) (string, error) {
	if d.ns != "" {
		args = append([]string{"-n", d.ns}, args...)
	}
	out, err := exec.Command("tc", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("tc %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// netemSpec is the netem options of a fault of kind, from rng.
func netemSpec(kind string, rng *rand.Rand) []string {
	switch kind {
	case "loss":
		return []string{"loss", strconv.Itoa(1+rng.IntN(20)) + "%"}
	case "reorder":
		return []string{"delay", "10ms", "reorder", "25%", "50%"}
	case "jitter":
		d := 5 + rng.IntN(46)
		return []string{"delay", fmt.Sprintf("%dms", d), fmt.Sprintf("%dms", d)}
	default: // blackhole
		return []string{"loss", "100%"}
	}
}

var droppedRE = regexp.MustCompile(`dropped (\d+)`)

// netFault puts netem with spec on every device for d, then takes it
// away, and returns the packets it dropped.
func netFault(devs []netDev, spec []string, d time.Duration) (dropped int, err error) {
	var on []netDev
	defer func() {
		for _, dev := range on {
			if out, e := dev.tc("-s", "qdisc", "show", "dev", dev.name, "root"); e == nil {
				if m := droppedRE.FindStringSubmatch(out); m != nil {
					n, _ := strconv.Atoi(m[1])
					dropped += n
				}
			}
			if _, e := dev.tc("qdisc", "del", "dev", dev.name, "root"); e != nil && err == nil {
				err = e
			}
		}
	}()
	for _, dev := range devs {
		if _, err := dev.tc(append([]string{"qdisc", "replace", "dev", dev.name, "root", "netem"}, spec...)...); err != nil {
			return 0, err
		}
		on = append(on, dev)
	}
	time.Sleep(d)
	return 0, nil
}
