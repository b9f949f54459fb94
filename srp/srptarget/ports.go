package srptarget

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/srp"
)

// Ports serves several SRP target ports — one Server each, typically one
// per SCSI target — on shared RDMA listeners: each login goes to the
// target port its SRP_LOGIN_REQ names (SRP r16a §6.3: the target port
// identifier), and a login naming none of them is rejected with "unable to
// associate RDMA channel with I_T nexus". Ports may be added and removed
// while the listeners run (a configuration reload).
type Ports struct {
	log *slog.Logger

	// Lock order: mu is taken alone (a Server's locks are never taken
	// under it, nor it under them); no RDMA operation runs under it.
	mu        sync.Mutex
	ports     map[srp.PortID]*Server
	listeners map[rdma.Listener]struct{}
	closed    bool
	wg        sync.WaitGroup
}

// NewPorts returns a multiplexer with no target ports.
func NewPorts(log *slog.Logger) *Ports {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Ports{log: log, ports: map[srp.PortID]*Server{}, listeners: map[rdma.Listener]struct{}{}}
}

// Add makes s reachable on the listeners.
func (p *Ports) Add(s *Server) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if o := p.ports[s.port]; o != nil && o != s {
		return fmt.Errorf("srp: target port %v is taken by %s", s.port, o.opts.Device.Name())
	}
	p.ports[s.port] = s
	return nil
}

// Remove makes s unreachable for new logins (its channels go on until
// s.Close).
func (p *Ports) Remove(s *Server) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ports[s.port] == s {
		delete(p.ports, s.port)
	}
}

// Serve accepts logins on ln until ln or p is closed.
func (p *Ports) Serve(ln rdma.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		ln.Close()
		return errors.New("srp: ports closed")
	}
	p.listeners[ln] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, ln)
		p.mu.Unlock()
	}()
	for {
		req, err := ln.Accept(context.Background())
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return nil
			}
			return err
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.route(req)
		}()
	}
}

// route hands a login to the target port it names.
func (p *Ports) route(req rdma.ConnRequest) {
	var lr srp.LoginReq
	err := decodeLogin(req, &lr)
	p.mu.Lock()
	s := p.ports[lr.Target]
	p.mu.Unlock()
	if err != nil || s == nil {
		why := "no such target port"
		if err != nil {
			why = err.Error()
		}
		p.log.Warn("srp: login rejected", "remote", req.RemoteAddr(), "initiator", lr.Initiator, "target_port", lr.Target.String(), "detail", why)
		rej := srp.LoginRej{Reason: srp.RejectAssociate, Tag: lr.Tag, BufFormats: srp.BufDirect | srp.BufIndirect}
		if err != nil {
			rej.Reason = srp.RejectUnable
		}
		_ = req.Reject(rej.Append(nil))
		return
	}
	s.admit(req, &lr)
}

// Close stops the listeners and waits for logins being routed; the
// servers' channels go on until each Server is closed.
func (p *Ports) Close() error {
	p.mu.Lock()
	p.closed = true
	for ln := range p.listeners {
		ln.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}
