// Package tcptarget is the NVMe/TCP transport of the NVMe-oF target (NVM
// Express TCP Transport Specification 1.0): one TCP connection per
// queue, set up by ICReq and ICResp, then command capsules (with data in
// the capsule up to the controller's in-capsule size), R2T and H2CData
// for the rest of a write's data, C2HData for a read's, response
// capsules, termination requests, and the header and data digests. The
// controller model is nvme/nvmetarget's; this package frames and moves.
package tcptarget

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blockwire/blockwire/blockcore"
	"github.com/blockwire/blockwire/internal/persource"
	"github.com/blockwire/blockwire/internal/sockpoll"
	"github.com/blockwire/blockwire/nvme/nvmetarget"
	"github.com/blockwire/blockwire/nvme/nvmetcp"
)

// Defaults of Options.
const (
	DefaultSetupTimeout = 10 * time.Second
	// DefaultSetups are as many as iSCSI's logins in progress (and
	// sshd's MaxStartups). DefaultSetupsPerSource are four controllers'
	// queues (16 I/O queues and the admin queue each): Linux opens every
	// I/O queue's connection, ICReq included, before it sends the first
	// I/O queue's Connect, so one host's controller holds up to 17 places
	// at once, and a host with two paths through one address twice that.
	DefaultSetups          = 256
	DefaultSetupsPerSource = 64
	DefaultConns           = 4096
)

// Options configure a Server.
type Options struct {
	Target *nvmetarget.Target
	Logger *slog.Logger
	// Budget bounds the data buffers of every connection together (and,
	// per source, through its shares); nil: unbounded but for each
	// queue's own bound.
	Budget *blockcore.IOBudget
	// SetupTimeout bounds the time from accepting a connection to its
	// Connect's answer.
	SetupTimeout time.Duration
	// Setups bounds the connections between accept and Connect; Conns
	// all connections. SetupsPerSource bounds one source's connections
	// between accept and Connect, so that one host opening connections
	// it never sets up cannot take every place from the others; Sources
	// says what a source is (an address, or an IPv6 network).
	Setups, Conns   int
	SetupsPerSource int
	Sources         persource.Sources
	// MaxH2CData is the most data one H2CData PDU may carry (MAXH2CDATA;
	// default and at most the target's largest transfer, at least 4096).
	MaxH2CData int
	// Poll has each connection's reader, once connected, poll its socket
	// after finding it empty before it sleeps, as the group says
	// (sockpoll: the next command is read as it lands, without a
	// wake-up; an idle connection costs nothing). nil: it sleeps at once.
	Poll *sockpoll.Group
}

// Server serves NVMe/TCP connections to a Target.
type Server struct {
	o   Options
	log *slog.Logger

	// mu guards ls, conns and setupsOf (taken alone; no I/O under it).
	mu       sync.Mutex
	ls       map[net.Listener]bool
	conns    map[*conn]bool
	closed   bool
	setupsOf persource.Counts[string] // the set-ups of each source

	setups atomic.Int32
	wg     sync.WaitGroup

	stats Stats
	// pools keep data buffers by size class (getBuf): 4 KiB to 8 MiB.
	pools [12]sync.Pool
}

// Stats are the server's counters (metrics).
type Stats struct {
	// Refused counts connections closed at accept: RefusedSetups of
	// them for the bound on set-ups, the rest for the bound on
	// connections.
	Accepted, Refused, RefusedSetups, Terminated atomic.Uint64
	// RefusedSetupsPerSource are of Refused: closed for their source's
	// set-ups (Options.SetupsPerSource).
	RefusedSetupsPerSource          atomic.Uint64
	Commands, ReadBytes, WriteBytes atomic.Uint64
	BudgetRefusals                  atomic.Uint64
}

// New returns a server for o.Target.
func New(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.SetupTimeout <= 0 {
		o.SetupTimeout = DefaultSetupTimeout
	}
	if o.Setups <= 0 {
		o.Setups = DefaultSetups
	}
	if o.Conns <= 0 {
		o.Conns = DefaultConns
	}
	if o.SetupsPerSource <= 0 {
		o.SetupsPerSource = DefaultSetupsPerSource
	}
	if o.MaxH2CData <= 0 || o.MaxH2CData > o.Target.MaxTransfer() {
		o.MaxH2CData = o.Target.MaxTransfer()
	}
	o.MaxH2CData = max(o.MaxH2CData, nvmetcp.MinMaxH2CData)
	return &Server{o: o, log: o.Logger, ls: map[net.Listener]bool{}, conns: map[*conn]bool{}}
}

// BoundsHit counts the times a host met a bound: connections in set-up,
// connections, the I/O budget, the controllers of the target, and
// connections terminated for a protocol violation (more commands than
// the queue, data beyond MAXH2CDATA, a bad digest, …).
func (s *Server) BoundsHit() map[string]uint64 {
	st := &s.stats
	out := map[string]uint64{"setups": st.RefusedSetups.Load(), "setups_per_source": st.RefusedSetupsPerSource.Load(),
		"connections": st.Refused.Load() - st.RefusedSetups.Load() - st.RefusedSetupsPerSource.Load(),
		"io_budget":   st.BudgetRefusals.Load(), "terminated": st.Terminated.Load(), "controllers": 0, "controllers_per_source": 0}
	if s.o.Target != nil {
		r := s.o.Target.Refusals()
		out["controllers"], out["controllers_per_source"] = r["controller limit"], r["controller limit of the source"]
	}
	return out
}

// Stats returns the server's counters.
func (s *Server) Stats() *Stats { return &s.stats }

// Conns is the number of open connections; Setups of those not yet
// connected to a controller.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}
func (s *Server) Setups() int { return int(s.setups.Load()) }

// ErrClosed is what Serve returns once the server is closed.
var ErrClosed = errors.New("tcptarget: server closed")

// Serve accepts connections on l until it fails or the server closes.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return ErrClosed
	}
	s.ls[l] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.ls, l)
		s.mu.Unlock()
	}()
	for {
		nc, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		s.accept(nc)
	}
}

// accept starts a connection's goroutines, or closes it at once when
// the bounds are reached.
func (s *Server) accept(nc net.Conn) {
	src := s.o.Sources.Of(nc.RemoteAddr())
	s.mu.Lock()
	setups := int(s.setups.Load()) >= s.o.Setups
	ofSource := s.setupsOf.Of(src) >= s.o.SetupsPerSource
	if s.closed || len(s.conns) >= s.o.Conns || setups || ofSource {
		s.mu.Unlock()
		s.stats.Refused.Add(1)
		switch {
		case setups:
			s.stats.RefusedSetups.Add(1)
		case ofSource:
			s.stats.RefusedSetupsPerSource.Add(1)
		}
		nc.Close()
		return
	}
	c := newConn(s, nc)
	c.src = src
	s.conns[c] = true
	s.setupsOf.Add(src)
	s.setups.Add(1)
	s.wg.Add(1)
	s.mu.Unlock()
	s.stats.Accepted.Add(1)
	go func() {
		defer s.wg.Done()
		c.serve()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
}

// Close stops accepting, ends every connection and waits for them.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	ls := make([]net.Listener, 0, len(s.ls))
	for l := range s.ls {
		ls = append(ls, l)
	}
	cs := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, c := range cs {
		c.Close()
	}
	s.wg.Wait()
}

// endSetup counts c's set-up as over (connected, or gone), once.
func (s *Server) endSetup(c *conn) {
	if !c.setup.Swap(false) {
		return
	}
	s.setups.Add(-1)
	s.mu.Lock()
	s.setupsOf.Give(c.src)
	s.mu.Unlock()
}
