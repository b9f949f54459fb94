// Package layering holds the test that keeps the import arrows pointing
// one way: SCSI ← iSCSI ← Datamover ← fabric ← RDMA, codecs without I/O,
// no fabric imported by the SCSI target core or by iSCSI, and one place
// (package node) where they are all assembled.
package layering

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const mod = "github.com/blockwire/blockwire/"

type pkg struct {
	ImportPath string
	Deps       []string
	Imports    []string
}

func TestImportsPointOneWay(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps=false", "-json", "../../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	pkgs := map[string]pkg{}
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs[strings.TrimPrefix(p.ImportPath, mod)] = p
	}
	deps := func(name string) []string {
		out, err := exec.Command("go", "list", "-deps", mod+name).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", name, err)
		}
		return strings.Fields(string(out))
	}
	// allowed exempts packages from a rule's forbidden prefixes.
	allowed := map[string][]string{
		"internal/uring": {mod + "internal/spin"},
		"config":         {mod + "scsi", mod + "srp", mod + "nvme/dhchap"},
	}
	rules := []struct {
		pkg       string
		forbidden []string // prefixes
	}{
		// The configuration is data and its checks: of ours it knows only
		// the SCSI, SRP and DH-HMAC-CHAP codecs (ALUA states, SRP port IDs,
		// NVMe secrets), which know nothing; the layers that use it import it, never the reverse.
		{"config", []string{mod, "log"}},
		// The daemon's binary carries no plotting library (blockwire-plot
		// draws bench results).
		{"cmd/blockwire", []string{"gonum.org/"}},
		// Codecs: no network, no logging, no goroutine-owning packages of ours.
		{"scsi", []string{mod, "net", "log"}},
		{"iscsi/pdu", []string{mod + "iscsi/text", mod + "datamover", mod + "scsitarget", "net", "log"}},
		{"iscsi/text", []string{mod + "iscsi/pdu", mod + "datamover", "net", "log"}},
		{"iscsi/auth", []string{mod + "datamover", "net", "log"}},
		// The block core is protocol-neutral: what every front end shares
		// (the unit's queue and workers, the I/O budget) knows no SCSI,
		// no NVMe and no fabric.
		{"blockcore", []string{mod + "scsi", mod + "scsitarget", mod + "iscsi", mod + "srp", mod + "nvme", mod + "datamover", mod + "rdma", mod + "fabric", mod + "node", "net"}},
		// The SCSI core knows no fabric.
		{"scsitarget", []string{mod + "iscsi", mod + "srp", mod + "datamover", mod + "rdma", mod + "fabric", mod + "node", "net"}},
		// iSCSI runs over the Datamover Interface alone: no concrete
		// datamover, no RDMA, no fabric (package fabric holds
		// what is a socket, an MPA exchange or a CM request).
		{"iscsi/iscsitarget", []string{mod + "datamover/", mod + "rdma", mod + "fabric", mod + "srp", mod + "node"}},
		{"iscsi/initiator", []string{mod + "datamover/", mod + "rdma", mod + "fabric", mod + "srp", mod + "node", mod + "scsitarget"}},
		// The fabrics know the datamovers and RDMA, never a session.
		{"fabric", []string{mod + "iscsi/iscsitarget", mod + "iscsi/initiator", mod + "scsitarget", mod + "srp", mod + "node"}},
		// The administration API and the metrics see the SCSI core's
		// fabric-neutral view only.
		{"admin", []string{mod + "iscsi", mod + "srp", mod + "datamover", mod + "rdma", mod + "fabric", mod + "node"}},
		{"metrics", []string{mod + "iscsi", mod + "srp", mod + "datamover", mod + "rdma", mod + "fabric", mod + "node"}},
		{"backend", []string{mod + "iscsi", mod + "scsitarget", mod + "datamover"}},
		// The io_uring ring is a system-call layer under the file backend:
		// nothing of ours but the polling time it shares with the
		// receivers (internal/spin, a leaf), no network, no logging.
		{"internal/uring", []string{mod, "net", "log"}},
		{"internal/spin", []string{mod, "net", "log"}},
		// The per-source counts every bound shares: a leaf of ours.
		{"internal/persource", []string{mod, "log"}},
		// Which repeated log lines are written: a leaf, logging nothing.
		{"internal/logsample", []string{mod, "net", "log"}},
		// A remote backend sees a block device, never the fabric behind it.
		{"backend/remote", []string{mod + "iscsi", mod + "srp", mod + "rdma", mod + "datamover", mod + "scsitarget", "net"}},
		// The datamover interface knows no concrete datamover and no session.
		{"datamover", []string{mod + "datamover/", mod + "iscsi/iscsitarget", mod + "scsitarget"}},
		{"datamover/tcp", []string{mod + "iscsi/iscsitarget", mod + "scsitarget", mod + "datamover/iser", mod + "rdma"}},
		{"datamover/iser", []string{mod + "iscsi/iscsitarget", mod + "scsitarget", mod + "datamover/tcp", mod + "rdma/"}},
		// RDMA is the bottom layer: it knows nothing of iSCSI, SCSI or
		// the datamover; its wire codecs do no I/O.
		{"rdma", []string{mod + "iscsi", mod + "scsitarget", mod + "datamover", mod + "scsi", mod + "rdma/"}},
		{"rdma/iwarp/mpa", []string{mod, "net", "log"}},
		{"rdma/iwarp/ddp", []string{mod, "net", "log"}},
		{"rdma/iwarp/rdmap", []string{mod + "rdma/iwarp/mpa", mod + "rdma/siw", mod + "iscsi", "net", "log"}},
		{"rdma/siw", []string{mod + "iscsi", mod + "scsitarget", mod + "datamover", mod + "scsi"}},
		// The InfiniBand transport codec (RoCEv2): no I/O.
		{"rdma/ib", []string{mod, "net", "log"}},
		{"rdma/roce", []string{mod + "iscsi", mod + "scsitarget", mod + "datamover", mod + "scsi", mod + "rdma/siw"}},
		// SRP sits beside iSCSI: SCSI ← SRP ← RDMA verbs, never a
		// concrete RDMA device; its codec does no I/O.
		{"srp", []string{mod, "net", "log"}},
		// NVMe's codecs: the command set and the NVMe/TCP PDUs, no I/O.
		{"nvme", []string{mod, "net", "log"}},
		{"nvme/nvmetcp", []string{mod, "net", "log"}},
		{"nvme/dhchap", []string{mod, "net", "log"}},
		// The NVMe controller model is the SCSI core's sibling over the
		// block core: no SCSI, no fabric, no transport of its own.
		{"nvme/nvmetarget", []string{mod + "scsi", mod + "scsitarget", mod + "iscsi", mod + "srp", mod + "datamover", mod + "rdma", mod + "fabric", mod + "node", mod + "nvme/tcptarget", mod + "nvme/tcphost"}},
		// NVMe/TCP frames and moves for the controller model; the host
		// knows only the codecs.
		{"nvme/tcptarget", []string{mod + "scsi", mod + "scsitarget", mod + "iscsi", mod + "srp", mod + "datamover", mod + "rdma", mod + "fabric", mod + "node", mod + "nvme/tcphost"}},
		{"nvme/tcphost", []string{mod + "blockcore", mod + "backend", mod + "scsi", mod + "iscsi", mod + "srp", mod + "datamover", mod + "rdma", mod + "fabric", mod + "node", mod + "nvme/nvmetarget", mod + "nvme/tcptarget"}},
		{"srp/srptarget", []string{mod + "iscsi", mod + "datamover", mod + "rdma/", mod + "srp/srpinitiator"}},
		{"srp/srpinitiator", []string{mod + "iscsi", mod + "datamover", mod + "rdma/", mod + "scsitarget"}},
		{"blockdev", []string{mod + "iscsi", mod + "srp", mod + "rdma", mod + "datamover", mod + "scsitarget", "net"}},
	}
	for _, r := range rules {
		if _, ok := pkgs[r.pkg]; !ok {
			t.Errorf("package %s not found", r.pkg)
			continue
		}
		for _, d := range deps(r.pkg) {
			if d == mod+r.pkg || slices.Contains(allowed[r.pkg], d) {
				continue
			}
			for _, f := range r.forbidden {
				if d == f || strings.HasPrefix(d, f+"/") || (strings.HasSuffix(f, "/") && strings.HasPrefix(d, f)) || (f == mod && strings.HasPrefix(d, mod) && d != mod+r.pkg) {
					t.Errorf("%s depends on %s", r.pkg, d)
				}
			}
		}
	}
}

// TestPackageNamesAreUnique: no two packages share a name (commands
// aside), so no import needs an alias and a name says which package it is.
func TestPackageNamesAreUnique(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.Name}} {{.ImportPath}}", "../../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, path, _ := strings.Cut(l, " ")
		if name == "main" {
			continue
		}
		if other, ok := seen[name]; ok {
			t.Errorf("packages %s and %s are both named %s", other, path, name)
		}
		seen[name] = path
	}
	if len(seen) < 20 {
		t.Fatalf("only %d packages listed", len(seen))
	}
}
