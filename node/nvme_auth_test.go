package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/internal/waitfor"
	"github.com/blockwire/blockwire/node"
	"github.com/blockwire/blockwire/nvme/dhchap"
	"github.com/blockwire/blockwire/nvme/tcphost"
)

// TestNVMeDHCHAP: a host whose ACL entry has a dhchap secret gets in
// only by proving it (and, with dhchap_ctrl, the controller proves itself
// to a host that asks); a host with another secret or none is refused, a
// host listed without a secret still connects; a changed secret ends the
// controllers that authenticated with the old one at once, and the new one
// works; discovery restricted the same way asks for the secret too.
func TestNVMeDHCHAP(t *testing.T) {
	ka, kc, kb := dhchap.NewSecret(32, dhchap.SHA256), dhchap.NewSecret(48, dhchap.SHA384), dhchap.NewSecret(32, 0)
	acl := func(hk dhchap.Secret) []config.ACL {
		return []config.ACL{
			{Host: hostA, DHCHAP: &config.Secret{Secret: hk.String()}, DHCHAPCtrl: &config.Secret{Secret: kc.String()}},
			{Host: hostB},
		}
	}
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, NVMeListen: []string{"127.0.0.1:0"},
		Discovery: &config.Discovery{ACL: []config.ACL{{Host: hostA, DHCHAP: &config.Secret{Secret: ka.String()}}}},
		Targets:   []config.Target{{Name: diskA, ACL: acl(ka), LUNs: []config.LUN{{ID: 0, Size: "8MiB"}}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, cfg, node.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nv := portal(t, n, config.NVMeTCP)
	nqn := config.NQNPrefix + diskA

	c, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostA, DHCHAP: &ka, DHCHAPCtrl: &kc, IOQueues: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Write(ctx, 1, 512, 0, make([]byte, 4096), true); err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]tcphost.Options{
		"another secret":                 {HostNQN: hostA, DHCHAP: &kb},
		"no secret":                      {HostNQN: hostA},
		"a controller with another one":  {HostNQN: hostA, DHCHAP: &ka, DHCHAPCtrl: &kb},
		"a host not listed, with secret": {HostNQN: "nqn.2014-08.org.nvmexpress:uuid:0000000c-0000-4000-8000-000000000000", DHCHAP: &ka},
	} {
		if c2, err := tcphost.Connect(ctx, nv, nqn, o); err == nil {
			c2.Close()
			t.Fatalf("%s: connected", name)
		}
	}
	cb, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostB})
	if err != nil {
		t.Fatalf("a host listed without a secret: %v", err)
	}
	cb.Close()

	// Discovery asks host A for its secret.
	if _, err := tcphost.Discover(ctx, nv, tcphost.Options{HostNQN: hostA}); err == nil {
		t.Fatal("discovery without the secret")
	}
	if es, err := tcphost.Discover(ctx, nv, tcphost.Options{HostNQN: hostA, DHCHAP: &ka}); err != nil || len(es) == 0 {
		t.Fatalf("discovery with the secret: %v, %d entries", err, len(es))
	}

	// The operator changes host A's secret: its controller ends now.
	next := n.Config()
	next.Targets[0].ACL = acl(kb)
	if _, err := n.Apply(next, node.Consent{}); err != nil {
		t.Fatal(err)
	}
	waitfor.True(t, 5*time.Second, func() bool {
		return c.Read(ctx, 1, 512, 0, make([]byte, 512)) != nil
	}, func() string { return "the controller authenticated with the old secret still reads" })
	if _, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostA, DHCHAP: &ka}); !errors.Is(err, tcphost.ErrAuthentication) {
		t.Fatalf("the old secret: %v, want an authentication failure", err)
	}
	c3, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostA, DHCHAP: &kb, DHCHAPCtrl: &kc})
	if err != nil {
		t.Fatalf("the new secret: %v", err)
	}
	c3.Close()

	// Through the administration API: host B gets a secret; it is asked
	// for at once.
	cb, err = tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostB})
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	kd := dhchap.NewSecret(32, dhchap.SHA512)
	if err := n.SetCHAP(admin.CHAPChange{Target: diskA, Initiator: hostB, NVMe: true, Secret: kd.String()}); err != nil {
		t.Fatal(err)
	}
	if err := n.SetCHAP(admin.CHAPChange{Target: diskA, Initiator: hostB, NVMe: true, Secret: "not a secret"}); err == nil {
		t.Fatal("the API took a secret not in the DHHC-1 form")
	}
	waitfor.True(t, 5*time.Second, func() bool {
		return cb.Read(ctx, 1, 512, 0, make([]byte, 512)) != nil
	}, func() string { return "host B's controller, made without a secret, still reads" })
	if c4, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostB}); err == nil {
		c4.Close()
		t.Fatal("host B connected without its new secret")
	}
	c5, err := tcphost.Connect(ctx, nv, nqn, tcphost.Options{HostNQN: hostB, DHCHAP: &kd})
	if err != nil {
		t.Fatalf("host B with its new secret: %v", err)
	}
	c5.Close()
}
