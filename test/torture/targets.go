package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/target"
	"github.com/blockwire/blockwire/rdma"
	"github.com/blockwire/blockwire/rdma/siw"
	"github.com/blockwire/blockwire/scsitarget"
)

// targetRunner runs the target: start (again, after a crash) returns its
// address; crash ends it as a power loss or SIGKILL would; stop ends it.
type targetRunner interface {
	start() (string, error)
	crash()
	stop()
}

// incarnation is the target in this process as it runs between two
// crashes: an LU on a fresh view of the disk, an iSCSI server, a
// listener.
type incarnation struct {
	cfg  *Config
	disk *volatileDisk
	srv  *target.Server
}

func (t *incarnation) start() (string, error) {
	log := t.cfg.Log
	dev := scsitarget.NewDevice(iqn, log)
	lu, err := scsitarget.NewLU(iqn, scsitarget.LUConfig{Backend: t.disk.View(), BlockSize: blockSize, WriteThrough: t.cfg.WriteThrough})
	if err != nil {
		return "", err
	}
	dev.AddLU(lu)
	t.srv = target.NewServer(log, target.Options{})
	if err := t.srv.AddTarget(&target.Target{Name: iqn, Device: dev}); err != nil {
		return "", err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	a := fabric.TCP(l)
	if t.cfg.Fabric == "iser" {
		a = fabric.Portal(l, fabric.ISERPortal{IWARP: siw.New(siw.Options{}), PD: rdma.NewDevice("torture").AllocPD()})
	}
	go t.srv.Serve(a)
	return l.Addr().String(), nil
}

// crash loses power under the target: the disk's cache goes first, then
// the server (nothing of it reaches the disk again).
func (t *incarnation) crash() {
	t.disk.Crash()
	t.stop()
}

// stop ends the server at once (no logout asked for).
func (t *incarnation) stop() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	t.srv.Shutdown(ctx)
}

// process is the target as a blockwire process serving a file, or one
// gateway of an RBD image.
type process struct {
	cfg  *Config
	name string   // its log's name in Dir ("target")
	lun  []string // serve's flags for LUN 0 (default: a file in Dir)
	addr string
	cmd  *exec.Cmd
	log  *os.File
}

func (p *process) start() (string, error) {
	if p.log == nil {
		if p.addr == "" {
			// A port of our own, kept across restarts.
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return "", err
			}
			p.addr = l.Addr().String()
			l.Close()
		}
		if p.name == "" {
			p.name = "target"
		}
		var err error
		if p.log, err = os.Create(filepath.Join(p.cfg.Dir, p.name+".log")); err != nil {
			return "", err
		}
	}
	lun := p.lun
	if lun == nil {
		lun = []string{"--file", filepath.Join(p.cfg.Dir, "lun.img"), "--size", strconv.Itoa(p.cfg.Blocks * blockSize)}
	}
	args := append([]string{"serve", "--listen", p.addr, "--iqn", iqn, "--block-size", strconv.Itoa(blockSize),
		"--iser=" + strconv.FormatBool(p.cfg.Fabric == "iser"), "--log-level", "warn",
		"--write-cache=" + strconv.FormatBool(!p.cfg.WriteThrough)}, lun...)
	p.cmd = exec.Command(p.cfg.Binary, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		return "", err
	}
	// A gateway opens its image first: under load, or while the cluster
	// still holds a killed gateway's lock, that takes a while.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", p.addr); err == nil {
			c.Close()
			return p.addr, nil
		}
	}
	p.crash()
	return "", fmt.Errorf("%s serve did not listen on %s within a minute (log: %s)", p.cfg.Binary, p.addr, p.log.Name())
}

func (p *process) crash() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
}

func (p *process) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
	p.log.Close()
}

// gateways are blockwire processes serving one RBD image as one LU, a
// target port group each (all active/optimized); a crash is one of them
// SIGKILLed and started again on its port.
type gateways struct {
	cfg *Config
	rng *rand.Rand
	ps  []*process
}

func (g *gateways) start() (string, error) {
	if g.ps == nil {
		var groups []string
		for i := range g.cfg.Gateways {
			groups = append(groups, fmt.Sprintf("%d=active-optimized", i+1))
		}
		for i := range g.cfg.Gateways {
			g.ps = append(g.ps, &process{cfg: g.cfg, name: fmt.Sprintf("gateway%d", i+1),
				lun: []string{"--rbd", g.cfg.RBD, "--ceph-conf", g.cfg.CephConf, "--tpgt", strconv.Itoa(i + 1),
					"--port-groups", strings.Join(groups, ",")}})
		}
		for _, p := range g.ps {
			if _, err := p.start(); err != nil {
				return "", err
			}
		}
		return g.ps[0].addr, nil
	}
	// After a crash: the one that died.
	for _, p := range g.ps {
		if p.cmd.ProcessState != nil {
			return p.start()
		}
	}
	return g.ps[0].addr, nil
}

func (g *gateways) crash() { g.ps[g.rng.IntN(len(g.ps))].crash() }

func (g *gateways) stop() {
	for _, p := range g.ps {
		if p.cmd.ProcessState == nil {
			p.stop()
		}
	}
}

func (g *gateways) addrs() []string {
	var out []string
	for _, p := range g.ps {
		out = append(out, p.addr)
	}
	return out
}
