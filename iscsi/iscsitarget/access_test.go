package iscsitarget

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/blockwire/blockwire/datamover"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/iscsi/pdu"
	"github.com/blockwire/blockwire/iscsi/text"
)

// TestDiscoveryCHAP: with discovery CHAP set, a discovery session without
// it fails with 0201 and learns nothing; with the right secret (one-way
// and mutual) it lists the targets; an initiator outside the discovery ACL
// gets 0202 (discovery needed no authentication at all).
func TestDiscoveryCHAP(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	creds := authCreds{User: "disc", Secret: "discovery-secret"}
	mutual := authCreds{User: "target", Secret: "target-secret-16"}
	if err := ts.srv.SetDiscovery(&Target{CHAP: &creds, MutualCHAP: &mutual}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, ts.addr)
	if st, _ := c.login(discoveryKeys(ini)...); st != pdu.LoginStatusAuthFailure {
		t.Fatalf("discovery without CHAP: status %04x, want 0201", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := initiator.Discover(ctx, ts.addr, initiator.Options{Dialer: &fabric.Dialer{}, CHAP: &authCreds{User: "disc", Secret: "wrong-secret-123"}})
	var le *initiator.LoginError
	if !errors.As(err, &le) {
		t.Fatalf("discovery with a wrong secret: %v", err)
	}
	got, err := initiator.Discover(ctx, ts.addr, initiator.Options{Dialer: &fabric.Dialer{}, CHAP: &creds, TargetCHAP: &mutual})
	if err != nil || len(got) != 1 || got[0].Name != testIQN {
		t.Fatalf("discovery with CHAP: %v %v", got, err)
	}
	if err := ts.srv.SetDiscovery(&Target{Initiators: []string{"iqn.2026-11.org.example:admin"}}); err != nil {
		t.Fatal(err)
	}
	c = dial(t, ts.addr)
	if st, _ := c.login(discoveryKeys(ini)...); st != pdu.LoginStatusAuthorizationFail {
		t.Fatalf("discovery by an initiator outside its ACL: status %04x, want 0202", st)
	}
	ts.srv.SetDiscovery(nil)
	c = dial(t, ts.addr)
	c.mustLogin(discoveryKeys(ini)...)
}

// TestLoginRedirect: a target configured to redirect answers its logins
// with 0101 (or 0102) and TargetAddress (RFC 7143 §11.13.5), after the ACL
// check; discovery still lists it.
func TestLoginRedirect(t *testing.T) {
	ts := startServer(t, Options{}, func(tg *Target) {
		tg.Redirect = "127.0.0.9:3261,2"
		tg.Initiators = []string{ini}
	})
	for _, permanent := range []bool{false, true} {
		tg := &Target{Name: testIQN, Initiators: []string{ini}, Redirect: "127.0.0.9:3261,2", RedirectPermanent: permanent}
		if err := ts.srv.UpdateTarget(tg); err != nil {
			t.Fatal(err)
		}
		c := dial(t, ts.addr)
		st, keys := c.login(normalKeys(ini)...)
		want := uint16(pdu.LoginStatusMovedTemporarily)
		if permanent {
			want = pdu.LoginStatusMovedPermanently
		}
		if st != want || keys["TargetAddress"] != "127.0.0.9:3261,2" {
			t.Fatalf("permanent=%v: status %04x keys %v", permanent, st, keys)
		}
	}
	c := dial(t, ts.addr)
	if st, keys := c.login(normalKeys("iqn.2026-11.org.example:stranger")...); st != pdu.LoginStatusAuthorizationFail || keys["TargetAddress"] != "" {
		t.Fatalf("a stranger learns where the target went: %04x %v", st, keys)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := initiator.Discover(ctx, ts.addr, initiator.Options{Dialer: &fabric.Dialer{}, InitiatorName: ini})
	if err != nil || len(got) != 1 {
		t.Fatalf("discovery: %v %v", got, err)
	}
}

// TestTargetOnItsPortalsOnly: a target bound to some portals is listed and
// reachable only there (0203 elsewhere, as if it did not exist); an ACL
// entry limited to a network admits its initiator only from it.
func TestTargetOnItsPortalsOnly(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go ts.srv.Serve(fabric.TCP(l2))
	first := ts.addr
	second := l2.Addr().String()
	tg := &Target{Name: testIQN, Portals: []string{first}}
	if err := ts.srv.UpdateTarget(tg); err != nil {
		t.Fatal(err)
	}
	c := dial(t, second)
	if st, _ := c.login(normalKeys(ini)...); st != pdu.LoginStatusNotFound {
		t.Fatalf("login through another portal: status %04x, want 0203", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := initiator.Discover(ctx, second, initiator.Options{Dialer: &fabric.Dialer{}}); err != nil || len(got) != 0 {
		t.Fatalf("discovery through another portal: %v %v", got, err)
	}
	got, err := initiator.Discover(ctx, first, initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil || len(got) != 1 || len(got[0].Addresses) != 1 || got[0].Addresses[0] != first+",1" {
		t.Fatalf("discovery through its portal: %+v %v", got, err)
	}
	c = dial(t, first)
	c.mustLogin(normalKeys(ini)...)

	// From a network only.
	tg = &Target{Name: testIQN, Sources: map[string][]netip.Prefix{ini: {netip.MustParsePrefix("127.0.0.2/32")}}}
	if err := ts.srv.UpdateTarget(tg); err != nil {
		t.Fatal(err)
	}
	c = dial(t, first)
	c.isid[5] = 2
	if st, _ := c.login(normalKeys(ini)...); st != pdu.LoginStatusAuthorizationFail {
		t.Fatalf("login from outside the initiator's network: status %04x, want 0202", st)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	nc, err := d.Dial("tcp", first)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	from2 := &tclient{t: t, nc: nc, r: bufio.NewReader(nc), isid: [6]byte{0x80, 0, 0, 0, 0, 3}, keys: map[string]string{}}
	from2.mustLogin(normalKeys(ini)...)
}

// TestTextContinuationConsumesItsCmdSN: a non-immediate Text Request that
// asks for the next part of a long response (as Linux's iscsid sends it
// over iSER: CmdSN 1, then 2) takes its CmdSN like any command — the
// response carries ExpCmdSN past it — and a command after it is delivered
// (it sat waiting for a CmdSN the target never took: a Logout after a
// long SendTargets hung).
func TestTextContinuationConsumesItsCmdSN(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	for i := range 20 {
		tg := &Target{Name: fmt.Sprintf("iqn.2026-11.org.blockwire:a-target-with-a-long-name-%03d", i), Device: ts.dev}
		ts.srv.AddTarget(tg)
	}
	c := dial(t, ts.addr)
	c.cmdSN = 1
	c.mustLogin(kv("InitiatorName", ini), kv("SessionType", "Discovery"), kv("MaxRecvDataSegmentLength", "512"))
	ttt := uint32(pdu.ReservedTTT)
	var data []byte = text.Append(nil, kv("SendTargets", "All"))
	for parts := 0; ; parts++ {
		req := pdu.TextReq{Final: true, ITT: 1, TTT: ttt, CmdSN: c.cmdSN}
		var h pdu.BHS
		req.Encode(&h)
		c.sendRaw(&h, nil, data)
		data = nil
		sent := c.cmdSN
		c.cmdSN++
		rh, _ := c.must(2 * time.Second)
		var r pdu.TextResp
		if err := r.Decode(&rh); err != nil {
			t.Fatal(err)
		}
		if exp := binary.BigEndian.Uint32(rh[28:]); exp != sent+1 {
			t.Fatalf("part %d: the response to CmdSN %d carries ExpCmdSN %d", parts, sent, exp)
		}
		if r.Final {
			break
		}
		ttt = r.TTT
	}
	lo := pdu.LogoutReq{ITT: 2, CmdSN: c.cmdSN}
	var h pdu.BHS
	lo.Encode(&h)
	c.sendRaw(&h, nil, nil)
	if rh, _ := c.must(2 * time.Second); rh.Opcode() != pdu.OpLogoutResp {
		t.Fatalf("after the text exchange, the Logout got %s", rh.Opcode())
	}
}

// sameAddr is an acceptor that accepts nothing at the address of another
// portal, as an iSER portal on a RoCE device shares its TCP portal's
// address.
type sameAddr struct {
	addr   string
	closed chan struct{}
}

func (a *sameAddr) Accept(context.Context) (datamover.Incoming, error) {
	<-a.closed
	return nil, net.ErrClosed
}
func (a *sameAddr) Addr() string { return a.addr }
func (a *sameAddr) Close() error {
	select {
	case <-a.closed:
	default:
		close(a.closed)
	}
	return nil
}

// TestSendTargetsListsAnAddressOnce: two portals on one address (iSCSI/TCP
// and iSER on an RDMA device) give one TargetAddress, not two.
func TestSendTargetsListsAnAddressOnce(t *testing.T) {
	ts := startServer(t, Options{}, nil)
	go ts.srv.Serve(&sameAddr{addr: ts.addr, closed: make(chan struct{})})
	deadline := time.Now().Add(5 * time.Second)
	for {
		ts.srv.mu.Lock()
		n := len(ts.srv.portals)
		ts.srv.mu.Unlock()
		if n == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	c := dial(t, ts.addr)
	c.mustLogin(kv("InitiatorName", ini), kv("SessionType", "Discovery"))
	req := pdu.TextReq{Immediate: true, Final: true, ITT: 1, TTT: pdu.ReservedTTT, CmdSN: c.cmdSN}
	var h pdu.BHS
	req.Encode(&h)
	c.sendRaw(&h, nil, text.Append(nil, kv("SendTargets", "All")))
	_, data := c.must(2 * time.Second)
	if n := strings.Count(string(data), "TargetAddress="); n != 1 {
		t.Fatalf("%d TargetAddress keys for one address:\n%q", n, data)
	}
}
