package tcptarget

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/waitfor"

	"github.com/blockwire/blockwire/nvme/dhchap"
	"github.com/blockwire/blockwire/nvme/nvmetarget"
	"github.com/blockwire/blockwire/nvme/tcphost"
)

// TestDHCHAP: a host with a secret authenticates every queue before it
// may do anything — with each Diffie-Hellman group and hash, one way and
// both ways — and reads and writes; a wrong secret, none, or a
// controller that cannot prove its own secret ends the connection; a
// host without a secret configured connects as before; an
// unauthenticated queue is refused everything but authentication.
func TestDHCHAP(t *testing.T) {
	const hostA, hostB = "nqn.2026-11.io.blockwire:host-a", "nqn.2026-11.io.blockwire:host-b"
	hostKey, ctrlKey := dhchap.NewSecret(32, dhchap.SHA256), dhchap.NewSecret(48, 0)
	f := startWith(t, Options{}, nvmetarget.SubsystemConfig{NQN: testNQN, Auth: func(host string) nvmetarget.AuthKeys {
		if host == hostA {
			return nvmetarget.AuthKeys{Host: &hostKey, Ctrl: &ctrlKey}
		}
		return nvmetarget.AuthKeys{}
	}})
	p := make([]byte, 4096)
	for i := range p {
		p[i] = byte(i * 7)
	}
	for _, o := range []tcphost.Options{
		{HostNQN: hostA, DHCHAP: &hostKey},
		{HostNQN: hostA, DHCHAP: &hostKey, DHCHAPCtrl: &ctrlKey, IOQueues: 2},
		{HostNQN: hostA, DHCHAP: &hostKey, DHCHAPCtrl: &ctrlKey, HeaderDigest: true, DataDigest: true},
	} {
		c := f.connect(o)
		if err := c.Write(ctx(t), 1, 512, 8, p, false); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(p))
		if err := c.Read(ctx(t), 1, 512, 8, got); err != nil || !bytes.Equal(got, p) {
			t.Fatalf("read back: %v", err)
		}
		c.Close()
	}
	waitfor.True(t, 5*time.Second, func() bool { return f.tgt.Controllers() == 0 }, func() string { return "controllers left" })

	wrong := dhchap.NewSecret(32, dhchap.SHA256)
	for name, o := range map[string]tcphost.Options{
		"a wrong secret":                   {HostNQN: hostA, DHCHAP: &wrong},
		"no secret":                        {HostNQN: hostA},
		"a controller with a wrong secret": {HostNQN: hostA, DHCHAP: &hostKey, DHCHAPCtrl: &wrong},
	} {
		c, err := tcphost.Connect(ctx(t), f.addr, testNQN, o)
		if err == nil {
			c.Close()
			t.Fatalf("%s: connected", name)
		}
		if name != "no secret" && !errors.Is(err, tcphost.ErrAuthentication) {
			t.Fatalf("%s: %v, want an authentication failure", name, err)
		}
	}
	if r := f.tgt.Refusals()["authentication failed"]; r < 1 {
		t.Fatalf("refusals %v: no authentication failure counted", f.tgt.Refusals())
	}
	// A host without a secret here connects without authenticating.
	c := f.connect(tcphost.Options{HostNQN: hostB})
	c.Close()
}

// TestDHCHAPGroups: the exchange with every group and hash the host may
// offer alone (the controller picks what both have).
func TestDHCHAPGroups(t *testing.T) {
	const host = "nqn.2026-11.io.blockwire:host-a"
	key := dhchap.NewSecret(64, dhchap.SHA512)
	sc := nvmetarget.SubsystemConfig{NQN: testNQN, Auth: func(string) nvmetarget.AuthKeys { return nvmetarget.AuthKeys{Host: &key, Ctrl: &key} }}
	f := startWith(t, Options{}, sc)
	for _, g := range dhchap.Groups() {
		for _, h := range dhchap.Hashes() {
			o := tcphost.Options{HostNQN: host, DHCHAP: &key, DHCHAPCtrl: &key, AuthHashes: []dhchap.Hash{h}, AuthGroups: []dhchap.Group{g}}
			c, err := tcphost.Connect(ctx(t), f.addr, testNQN, o)
			if err != nil {
				t.Fatalf("group %d, %v: %v", g, h, err)
			}
			c.Close()
		}
	}
}
