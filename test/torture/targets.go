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

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/node"
)

// targetRunner runs the target: start (again, after a crash) returns its
// address; crash ends it as a power loss or SIGKILL would and says which
// target ended (the gateway's number; 0 when there is one); stop ends it.
type targetRunner interface {
	start() (string, error)
	crash() int
	stop()
	// iscsi is the target's iSCSI portal when it serves another fabric
	// (NVMe/TCP) on the address start returned ("" when none).
	iscsi() string
}

// incarnation is the target in this process as it runs between two
// crashes: a node (node.New, as blockwire serve assembles it) whose LU
// sits on a fresh view of the disk, given through Options.Backend.
type incarnation struct {
	cfg  *Config
	disk *volatileDisk
	n    *node.Node
}

func (t *incarnation) start() (string, error) {
	iser := t.cfg.Fabric == "iser"
	writeCache := !t.cfg.WriteThrough
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, ISER: &iser, Targets: []config.Target{{Name: iqn,
		LUNs: []config.LUN{{ID: 0, Size: strconv.FormatInt(t.disk.View().Size(), 10), BlockSize: blockSize, WriteCache: &writeCache}}}}}
	if t.cfg.Fabric == "nvme" {
		cfg.NVMeListen = []string{"127.0.0.1:0"}
	}
	n, err := node.New(cfg, node.Options{Logger: t.cfg.Log, Backend: func(string, config.LUN) (backend.Backend, error) {
		return t.disk.Backend(), nil
	}})
	if err != nil {
		return "", err
	}
	if err := n.Start(); err != nil {
		return "", err
	}
	t.n = n
	want := config.ISCSI
	if t.cfg.Fabric == "nvme" {
		want = config.NVMeTCP
	}
	for _, p := range n.Portals() {
		if p.Transport == want {
			return p.Address, nil
		}
	}
	t.stop()
	return "", fmt.Errorf("the node has no %s portal", want)
}

func (t *incarnation) iscsi() string {
	for _, p := range t.n.Portals() {
		if p.Transport == config.ISCSI {
			return p.Address
		}
	}
	return ""
}

// crash loses power under the target: the disk's cache goes first, then
// the server (nothing of it reaches the disk again).
func (t *incarnation) crash() int {
	t.disk.Crash()
	t.stop()
	return 0
}

// stop ends the node at once (no logout waited for).
func (t *incarnation) stop() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	t.n.Shutdown(ctx)
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
	// cut is the error of the last power-cut command (Config.PowerCut):
	// the next start reports it.
	cut error
	// iscsiAddr is its iSCSI portal when it serves NVMe/TCP on addr.
	iscsiAddr string
}

func (p *process) iscsi() string { return p.iscsiAddr }

func (p *process) start() (string, error) {
	if p.cut != nil {
		return "", p.cut
	}
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
		file := p.cfg.LUNFile
		if file == "" {
			file = filepath.Join(p.cfg.Dir, "lun.img")
		}
		lun = []string{"--file", file, "--size", strconv.Itoa(p.cfg.Blocks * blockSize)}
	}
	listen := []string{"--listen", p.addr}
	if p.cfg.Fabric == "nvme" {
		// NVMe/TCP on the target's address; iSCSI on one of its own.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		p.iscsiAddr = l.Addr().String()
		listen = []string{"--nvme-listen", p.addr, "--listen", p.iscsiAddr}
		l.Close()
	}
	args := append(append([]string{"serve"}, listen...), "--iqn", iqn, "--block-size", strconv.Itoa(blockSize),
		"--iser="+strconv.FormatBool(p.cfg.Fabric == "iser"), "--log-level", "warn",
		"--write-cache="+strconv.FormatBool(!p.cfg.WriteThrough))
	args = append(args, lun...)
	args = append(args, p.cfg.ServeArgs...)
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

// crash SIGKILLs the process; with Config.PowerCut, the command then
// takes from the storage what a power cut at that moment would have.
func (p *process) crash() int {
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
	if p.cfg.PowerCut == "" {
		return 0
	}
	cmd := exec.Command("sh", "-c", p.cfg.PowerCut)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Run(); err != nil {
		p.cut = fmt.Errorf("the power cut (%s) failed: %v (its output is in %s)", p.cfg.PowerCut, err, p.log.Name())
	}
	return 0
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

func (g *gateways) iscsi() string { return "" }

func (g *gateways) crash() int {
	k := g.rng.IntN(len(g.ps))
	g.ps[k].crash()
	return k
}

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
