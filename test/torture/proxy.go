package main

import (
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"time"
)

// proxy stands between the initiators and the target on loopback and
// injects the network's faults: it resets connections, partitions (holds
// every byte and every new connection, then resets), and delays.
type proxy struct {
	l net.Listener

	mu          sync.Mutex // guards what follows; never held across I/O
	target      string     // where connections go now
	conns       map[net.Conn]bool
	partitioned bool
	delay       time.Duration
	cond        *sync.Cond // signalled when partitioned ends
}

func newProxy(target string) (*proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{l: l, target: target, conns: map[net.Conn]bool{}}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	return p, nil
}

func (p *proxy) Addr() string { return p.l.Addr().String() }

func (p *proxy) Close() {
	p.l.Close()
	p.Reset()
}

// SetTarget points new connections at addr (a restarted target).
func (p *proxy) SetTarget(addr string) {
	p.mu.Lock()
	p.target = addr
	p.mu.Unlock()
}

// Reset closes every connection (both sides see a reset or EOF).
func (p *proxy) Reset() {
	p.mu.Lock()
	cs := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	clear(p.conns)
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// ResetOne closes one connection, picked with rng (with MC/S, the
// session's other connections live on).
func (p *proxy) ResetOne(rng *rand.Rand) {
	p.mu.Lock()
	var cs []net.Conn
	for c, front := range p.conns {
		if front {
			cs = append(cs, c)
		}
	}
	p.mu.Unlock()
	if len(cs) == 0 {
		return
	}
	slices.SortFunc(cs, func(a, b net.Conn) int { return strings.Compare(a.RemoteAddr().String(), b.RemoteAddr().String()) })
	cs[rng.IntN(len(cs))].Close()
}

// Partition holds all traffic for d, then resets every connection (the
// target's and the initiator's timers would have ended them anyway).
func (p *proxy) Partition(d time.Duration) {
	p.mu.Lock()
	p.partitioned = true
	p.mu.Unlock()
	time.Sleep(d)
	p.mu.Lock()
	p.partitioned = false
	p.cond.Broadcast()
	p.mu.Unlock()
	p.Reset()
}

// Delay adds d to every chunk forwarded, for how long.
func (p *proxy) Delay(d, how time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
	time.Sleep(how)
	p.mu.Lock()
	p.delay = 0
	p.mu.Unlock()
}

// gate waits out a partition and returns the delay to apply.
func (p *proxy) gate() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.partitioned {
		p.cond.Wait()
	}
	return p.delay
}

func (p *proxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *proxy) serve(c net.Conn) {
	p.gate()
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	t, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[t] = true, false // true: the initiator's side
	p.mu.Unlock()
	go p.pipe(t, c)
	p.pipe(c, t)
}

// pipe copies from src to dst until either ends, then closes both.
func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := p.gate(); d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	src.Close()
	dst.Close()
	p.mu.Lock()
	delete(p.conns, src)
	delete(p.conns, dst)
	p.mu.Unlock()
}

// proxies are the proxies of several targets (gateways); a fault aimed
// at "the network" hits them all.
type proxies []*proxy

// addrs are the proxies' addresses.
func (ps proxies) addrs() []string {
	out := make([]string, len(ps))
	for k, p := range ps {
		out[k] = p.Addr()
	}
	return out
}

func (ps proxies) Reset() {
	for _, p := range ps {
		p.Reset()
	}
}

// Partition holds every proxy's traffic for d at once.
func (ps proxies) Partition(d time.Duration) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); p.Partition(d) }()
	}
	wg.Wait()
}

// Delay delays every proxy's traffic.
func (ps proxies) Delay(d, how time.Duration) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); p.Delay(d, how) }()
	}
	wg.Wait()
}
