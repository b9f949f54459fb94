package isns

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Node is one target to register.
type Node struct {
	Name  string // iSCSI name
	Alias string
	TPGT  uint16 // portal group tag of all the portals
}

// Client registers one network entity — this blockwire process — with its
// portals and targets (RFC 4171 §5.6.5.1), refreshes the registration
// before the server's registration period ends, and deregisters it.
type Client struct {
	Server   string // host[:port], port 3205 by default
	EntityID string // Entity Identifier (EID)
	Portals  []netip.AddrPort
	Nodes    []Node
	Log      *slog.Logger

	mu  sync.Mutex
	xid uint16
}

func (c *Client) addr() string {
	if _, _, err := net.SplitHostPort(c.Server); err == nil {
		return c.Server
	}
	return net.JoinHostPort(c.Server, "3205")
}

// exchange sends one message and returns the server's response.
func (c *Client) exchange(ctx context.Context, function, flags uint16, attrs ...Attr) (Response, error) {
	c.mu.Lock()
	c.xid++
	xid := c.xid
	c.mu.Unlock()
	msg, err := Message(function, flags, xid, attrs...)
	if err != nil {
		return Response{}, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", c.addr())
	if err != nil {
		return Response{}, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	if _, err := conn.Write(msg); err != nil {
		return Response{}, err
	}
	var payload []byte
	var h Header
	for {
		var hb [HeaderLen]byte
		if _, err := io.ReadFull(conn, hb[:]); err != nil {
			return Response{}, fmt.Errorf("isns: reading the response: %w", err)
		}
		if h, err = DecodeHeader(hb[:]); err != nil {
			return Response{}, err
		}
		part := make([]byte, h.Length)
		if _, err := io.ReadFull(conn, part); err != nil {
			return Response{}, fmt.Errorf("isns: reading the response: %w", err)
		}
		if h.XID != xid || h.Function != function|ResponseBit {
			return Response{}, fmt.Errorf("isns: response %#04x/%d to request %#04x/%d", h.Function, h.XID, function, xid)
		}
		if len(payload)+len(part) > 1<<20 {
			return Response{}, fmt.Errorf("isns: response larger than 1 MiB")
		}
		payload = append(payload, part...)
		if h.Flags&FlagLast != 0 {
			break
		}
	}
	r, err := DecodeResponse(h, payload)
	if err != nil {
		return r, err
	}
	if r.Status != 0 {
		return r, fmt.Errorf("isns: %s refused %s: %s (%d)", c.addr(), funcName(function), StatusText(r.Status), r.Status)
	}
	return r, nil
}

func funcName(f uint16) string {
	switch f {
	case DevAttrReg:
		return "DevAttrReg"
	case DevDereg:
		return "DevDereg"
	case DevAttrQry:
		return "DevAttrQry"
	}
	return fmt.Sprintf("function %#04x", f)
}

// Register registers (or refreshes) the entity with its portals, nodes and
// portal groups, replacing what the server had for it (§5.6.5.1, the
// Replace flag). It returns the registration period the server grants.
func (c *Client) Register(ctx context.Context) (time.Duration, error) {
	if len(c.Nodes) == 0 {
		return 0, fmt.Errorf("isns: nothing to register")
	}
	attrs := []Attr{
		String(TagISCSIName, c.Nodes[0].Name), // the source (§5.6.1)
		String(TagEntityID, c.EntityID),       // the message key
		Delimiter(),
		String(TagEntityID, c.EntityID),
		Uint32(TagEntityProtocol, EntityProtocolISCSI),
	}
	for _, p := range c.Portals {
		attrs = append(attrs, IP(TagPortalIP, p.Addr()), Port(TagPortalPort, p.Port()))
	}
	for _, n := range c.Nodes {
		attrs = append(attrs, String(TagISCSIName, n.Name), Uint32(TagISCSINodeType, NodeTypeTarget))
		if n.Alias != "" {
			attrs = append(attrs, String(TagISCSIAlias, n.Alias))
		}
	}
	// Portal groups: every node on every portal with its tag (§6.5).
	for _, n := range c.Nodes {
		for _, p := range c.Portals {
			attrs = append(attrs, String(TagPGISCSIName, n.Name), IP(TagPGPortalIP, p.Addr()),
				Port(TagPGPortalPort, p.Port()), Uint32(TagPGTag, uint32(n.TPGT)))
		}
	}
	r, err := c.exchange(ctx, DevAttrReg, FlagReplace, attrs...)
	if err != nil {
		return 0, err
	}
	period := 15 * time.Minute
	for _, a := range r.Attrs {
		if a.Tag == TagRegPeriod && len(a.Value) == 4 {
			if s := time.Duration(uint32(a.Value[0])<<24|uint32(a.Value[1])<<16|uint32(a.Value[2])<<8|uint32(a.Value[3])) * time.Second; s > 0 {
				period = s
			}
		}
	}
	return period, nil
}

// Deregister removes the entity and everything registered with it
// (§5.6.5.4).
func (c *Client) Deregister(ctx context.Context) error {
	if len(c.Nodes) == 0 {
		return nil
	}
	_, err := c.exchange(ctx, DevDereg, 0, String(TagISCSIName, c.Nodes[0].Name), Delimiter(), String(TagEntityID, c.EntityID))
	return err
}

// Run registers, refreshes the registration at half the registration
// period (retrying every 10 s after a failure) until ctx ends, then
// deregisters.
func (c *Client) Run(ctx context.Context) {
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	next := time.Duration(0)
	registered := false
	for {
		select {
		case <-ctx.Done():
			if registered {
				dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := c.Deregister(dctx); err != nil {
					log.Warn("iSNS deregistration failed", "server", c.addr(), "err", err)
				} else {
					log.Info("deregistered from iSNS", "server", c.addr(), "entity", c.EntityID)
				}
				cancel()
			}
			return
		case <-time.After(next):
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		period, err := c.Register(rctx)
		cancel()
		if err != nil {
			log.Warn("iSNS registration failed", "server", c.addr(), "err", err)
			next = 10 * time.Second
			continue
		}
		if !registered {
			log.Info("registered with iSNS", "server", c.addr(), "entity", c.EntityID, "targets", len(c.Nodes), "portals", len(c.Portals))
		}
		registered = true
		next = period / 2
	}
}
