// Command man writes blockwire(1) in roff from blockwire's own help: the
// overview (blockwire --help) and each verb's flags (blockwire VERB -h),
// so the manual says what the binary says. Usage:
//
//	go run ./packaging/man PATH-TO-BLOCKWIRE > blockwire.1
package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

func main() {
	// The sections of the manual, in order, each with the arguments that
	// print its help.
	verbs := [][]string{
		{"serve", "-h"}, {"config", "check", "-h"}, {"discover", "-h"}, {"inquiry", "-h"}, {"read", "-h"},
		{"write", "-h"}, {"copy", "-h"}, {"bench", "-h"}, {"admin", "-h"},
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./packaging/man PATH-TO-BLOCKWIRE > blockwire.1")
		os.Exit(2)
	}
	bin := os.Args[1]
	help := func(args ...string) string {
		var out bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.Run() // -h exits 0; the text is what matters
		return out.String()
	}
	var b strings.Builder
	b.WriteString(".TH BLOCKWIRE 1 \"\" \"blockwire\" \"User Commands\"\n")
	b.WriteString(".SH NAME\nblockwire \\- iSCSI, iSER and SRP target and initiator\n")
	b.WriteString(".SH SYNOPSIS\n.B blockwire\n.I command\n[\\fIflags\\fR] [\\fIarguments\\fR]\n")
	b.WriteString(".SH DESCRIPTION\n")
	pre(&b, help("--help"))
	b.WriteString(".SH COMMANDS\n")
	for _, v := range verbs {
		fmt.Fprintf(&b, ".SS %s\n", strings.Join(v[:len(v)-1], " "))
		pre(&b, help(v...))
	}
	b.WriteString(".SH CONFIGURATION\n")
	b.WriteString("serve --config reads a TOML file (/etc/blockwire/blockwire.toml for the systemd unit; " +
		"/usr/share/doc/blockwire/examples/blockwire.toml shows every key). Its keys, from the schema itself " +
		"(blockwire config keys), with their types, defaults, serve flags and when a change applies; a path such as target.lun.size is the key size " +
		"of a [[target.lun]] table:\n")
	pre(&b, help("config", "keys"))
	b.WriteString("Changes made with blockwire admin are recorded in the node's state (serve --state) before they take " +
		"effect and outlast restarts; the file is never rewritten (blockwire config diff FILE shows what a reload of it would change).\n")
	b.WriteString(".SH EXAMPLES\n")
	pre(&b, `Serve 1 GiB in memory on 127.0.0.1:3260:
    blockwire serve
Serve a disk image, created sparse when missing:
    blockwire serve --file /var/lib/blockwire/disk.img --size 20GiB
Check a configuration, then see what reloading it would change:
    blockwire config check /etc/blockwire/blockwire.toml
    blockwire admin reload --dry-run
Grow a LUN live, admit an initiator seeing only LUN 1, give it CHAP:
    blockwire admin resize iqn.2026-11.org.example:db 0 40GiB
    blockwire admin acl-add iqn.2026-11.org.example:db iqn.2026-11.org.example:host1 --luns 1
    blockwire admin chap iqn.2026-11.org.example:db iqn.2026-11.org.example:host1 --user host1 --secret-stdin < host1.secret
    blockwire admin ls
Copy an image onto a LUN, then check the LUN at depth 32:
    blockwire copy disk.img iscsi://127.0.0.1:3260/iqn.2026-11.org.blockwire:default/0
    blockwire bench --rw randread --qd 32 iscsi://127.0.0.1:3260/iqn.2026-11.org.blockwire:default/0`)
	b.WriteString(".SH FILES\n.TP\n/etc/blockwire/blockwire.toml\nthe configuration the systemd unit serves (blockwire.service)\n")
	b.WriteString(".TP\n/run/blockwire/admin.sock\nthe administration socket\n.TP\n/var/lib/blockwire\nLUN images and reservation files\n")
	b.WriteString(".SH SEE ALSO\n.BR iscsiadm (8),\n.BR sg_persist (8)\n")
	os.Stdout.WriteString(b.String())
}

// pre writes text as a no-fill block, escaped for roff.
func pre(b *strings.Builder, text string) {
	b.WriteString(".nf\n")
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		line = strings.ReplaceAll(line, "\\", "\\e")
		if strings.HasPrefix(line, ".") || strings.HasPrefix(line, "'") {
			line = "\\&" + line
		}
		b.WriteString(line + "\n")
	}
	b.WriteString(".fi\n")
}
