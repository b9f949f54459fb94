package node_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/blockwire/blockwire/backend"
	"github.com/blockwire/blockwire/backend/mem"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/fabric"
	"github.com/blockwire/blockwire/iscsi/initiator"
	"github.com/blockwire/blockwire/node"
)

// closeCounter is storage of the embedding program's, counting Close.
type closeCounter struct {
	*mem.Disk
	closed *atomic.Int32
}

func (c closeCounter) Close() error { c.closed.Add(1); return nil }

// TestBackendHook: Options.Backend serves a program's own storage on the
// LUNs it claims (an initiator reads what the program put there), leaves
// the others to the built-in backends, fails a LUN with its error, and
// the LU closes what it was given when the node shuts down.
func TestBackendHook(t *testing.T) {
	own, err := mem.New(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	mark := bytes.Repeat([]byte("mine"), 128)
	own.WriteAt(mark, 8192)
	var closed atomic.Int32
	var asked []string
	open := func(target string, lun config.LUN) (backend.Backend, error) {
		asked = append(asked, target)
		switch target {
		case diskA:
			return closeCounter{own, &closed}, nil
		case diskC:
			return nil, errors.New("no such volume")
		}
		return nil, nil // built in
	}
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"}, Targets: []config.Target{
		{Name: diskA, LUNs: []config.LUN{{ID: 0, Size: "1MiB"}}},
		{Name: diskB, LUNs: []config.LUN{{ID: 0, Size: "2MiB"}}},
	}}
	n := startNode(t, cfg, node.Options{Backend: open})
	addr := portal(t, n, config.ISCSI)
	ctx := context.Background()
	d, err := initiator.Open(ctx, "iscsi://"+addr+"/"+diskA+"/0", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(mark))
	if _, err := d.ReadAt(got, 8192); err != nil || !bytes.Equal(got, mark) {
		t.Fatalf("read %q, %v: not the program's storage", got[:8], err)
	}
	d.Close()
	b, err := initiator.Open(ctx, "iscsi://"+addr+"/"+diskB+"/0", initiator.Options{Dialer: &fabric.Dialer{}})
	if err != nil {
		t.Fatal(err)
	}
	if b.Size() != 2<<20 {
		t.Errorf("the LUN left to the built-in backends has %d bytes, want 2 MiB", b.Size())
	}
	b.Close()
	if strings.Join(asked, " ") != diskA+" "+diskB {
		t.Errorf("asked for %q", asked)
	}
	// A LUN whose storage the program cannot open is not built.
	bad := &config.Config{Listen: []string{"127.0.0.1:0"}, Targets: []config.Target{{Name: diskC, LUNs: []config.LUN{{ID: 0, Size: "1MiB"}}}}}
	if _, err := node.New(bad, node.Options{Backend: open}); err == nil || !strings.Contains(err.Error(), "no such volume") {
		t.Errorf("a LUN with no storage: %v", err)
	}
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if closed.Load() != 1 {
		t.Errorf("the program's storage closed %d times at shutdown, want 1", closed.Load())
	}
}
