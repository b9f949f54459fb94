package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/node"
)

const adminUsage = `usage: blockwire admin [--socket PATH | --url http://HOST:PORT [--token-file F]] [--json] VERB
  ls                                what the node serves: portals, targets, their access
                                    rules, LUNs (backing, size, cache) and sessions
  sessions                          every fabric's sessions (iSCSI, iSER, SRP, NVMe controllers), connections, commands in flight
  drop ID                           end a session (its ID: an iSCSI TSIH, srp-N, nvme-CNTLID@NQN)
  luns                              every target's LUNs
  add-lun TARGET LUN (--size S | --file F | --remote URL) [--block-size N] [--read-only]
  remove-lun TARGET LUN [--force]  a LUN with sessions or commands in progress needs --force
  resize TARGET LUN SIZE [--shrink] connected initiators get CAPACITY DATA HAS CHANGED;
                                    a smaller size needs --shrink (the data past it is lost)
  add-target NAME (--size S | --file F | --remote URL) [--initiators A,B]   with LUN 0
  remove-target NAME [--force]      closes its sessions (which needs --force)
  set-initiators TARGET [A,B,...]   the ACL (none: everyone); an initiator no longer
                                    admitted loses its session at once
  acl-add TARGET INITIATOR [--from NETS] [--luns L,...] [--srp | --nvme]
                                    admit an initiator (an SRP port with --srp, an NVMe host
                                    NQN with --nvme): from these networks only, seeing these
                                    LUNs only (N, or M=N: LUN N as M; NVMe: N only)
  acl-remove TARGET INITIATOR [--srp | --nvme]
  acl-from TARGET INITIATOR [NETS]  where it may log in from (none: anywhere)
  map-lun TARGET INITIATOR N|M=N    let it see LUN N (as M)
  unmap-lun TARGET INITIATOR M      hide the LUN it sees as M
  chap (TARGET [INITIATOR] | --discovery) [--mutual] (--user U (--secret-file F | --secret-stdin) | --clear)
                                    CHAP for a target, one initiator's ACL entry or discovery;
                                    --mutual: the target's own (mutual CHAP). Secrets never on
                                    the command line: a file in an --admin-dir, or standard input
  chap --nvme (TARGET HOST-NQN | --discovery HOST-NQN) [--mutual] (--secret-file F | --secret-stdin | --clear)
                                    an NVMe host's DH-HMAC-CHAP secret (DHHC-1:…);
                                    --mutual: the controller's (bidirectional)
  portals TARGET [ADDR,...]         the iSCSI portals that serve it (none: every portal)
  reload [--dry-run] [--shrink] [--force]
                                    apply the changes the configuration file made since it
                                    was last applied, on top of the live ones (as SIGHUP);
                                    --dry-run prints them and changes nothing; what would
                                    lose data or cut initiators off is refused whole unless
                                    --shrink (smaller in-memory LUNs) or --force
  save [FILE]                       write the running configuration (default: its file)
Every change is recorded in the node's state file (serve --state) before it takes
effect, so it lasts across restarts; the configuration file is never rewritten but
by save (docs/operations.md).
The socket is serve's --admin-socket (or BLOCKWIRE_ADMIN_SOCKET; default
/run/blockwire/admin.sock, the systemd unit's); --url is
serve's --admin-http, with the token serve wrote to its --admin-http-token file.
File paths (add-lun --file, save FILE) must lie in a directory serve was given
with --admin-dir (admin_dirs). With --json, sessions and luns print the API's
JSON (docs/json.md); the other verbs always answer in JSON.
`

// defaultAdminSocket is where the systemd unit (packaging/) puts the
// administration socket; admin uses it when told no other.
const defaultAdminSocket = "/run/blockwire/admin.sock"

// adminVerbs are the verbs admin knows, each with the function that runs
// it: its arguments checked, its request made, its answer printed.
var adminVerbs = map[string]func(*adminCall) int{
	"ls": adminLs, "sessions": adminSessions, "luns": adminLuns, "drop": adminDrop,
	"add-lun": adminAddLUN, "remove-lun": adminRemoveLUN, "resize": adminResize,
	"add-target": adminAddTarget, "remove-target": adminRemoveTarget,
	"set-initiators": adminList, "portals": adminList,
	"acl-add": adminACL, "acl-remove": adminACL, "acl-from": adminACL, "map-lun": adminACL, "unmap-lun": adminACL,
	"chap": adminCHAP, "reload": adminReload, "save": adminSave,
}

// adminFlags are admin's flags; each verb reads those it takes.
type adminFlags struct {
	sock, apiURL, tokenFile                                      *string
	size, file, remoteURL                                        *string
	blockSize                                                    *int
	readOnly, shrink, force, dryRun                              *bool
	from, lunList, user, secretFile, initiators                  *string
	srpPort, nvmeHost, secretStdin, clearCHAP, mutual, discovery *bool
	asJSON                                                       *bool
}

func newAdminFlags(fs *flag.FlagSet) *adminFlags {
	defSock := os.Getenv("BLOCKWIRE_ADMIN_SOCKET")
	if defSock == "" {
		defSock = defaultAdminSocket
	}
	return &adminFlags{
		sock:        fs.String("socket", defSock, "the administration socket (or BLOCKWIRE_ADMIN_SOCKET)"),
		apiURL:      fs.String("url", "", "the administration API over HTTP (serve --admin-http), instead of the socket"),
		tokenFile:   fs.String("token-file", node.DefaultTokenFile(), "with --url: the file holding serve's token"),
		size:        fs.String("size", "", "add-lun: an in-memory LUN of this size"),
		file:        fs.String("file", "", "add-lun: a file-backed LUN"),
		remoteURL:   fs.String("remote", "", "add-lun: another target's LUN (gateway)"),
		blockSize:   fs.Int("block-size", 0, "add-lun: logical block size"),
		readOnly:    fs.Bool("read-only", false, "add-lun: write-protected"),
		shrink:      fs.Bool("shrink", false, "resize, reload: allow a smaller size (the data past it is lost; a reload never truncates a file)"),
		force:       fs.Bool("force", false, "remove-lun, remove-target, reload: allow removing or replacing what is in use, replacing in-memory LUNs, and the file's side of a conflict with live changes"),
		dryRun:      fs.Bool("dry-run", false, "reload: print what would change, change nothing"),
		from:        fs.String("from", "", "acl-add: the networks it may log in from, comma-separated"),
		lunList:     fs.String("luns", "", "acl-add: the LUNs it sees, comma-separated (N, or M=N)"),
		srpPort:     fs.Bool("srp", false, "acl-*: the initiator is an SRP port (ID_EXT:GUID)"),
		nvmeHost:    fs.Bool("nvme", false, "acl-*, map-lun, unmap-lun: the initiator is an NVMe host NQN (its LUNs are plain numbers: the namespaces N+1 it sees); chap: its DH-HMAC-CHAP secret (with --mutual, the controller's)"),
		user:        fs.String("user", "", "chap: the user name"),
		secretFile:  fs.String("secret-file", "", "chap: the file holding the secret (in an --admin-dir; the node reads it)"),
		secretStdin: fs.Bool("secret-stdin", false, "chap: read the secret from standard input (kept in the node's state, mode 0600)"),
		clearCHAP:   fs.Bool("clear", false, "chap: remove the credentials"),
		mutual:      fs.Bool("mutual", false, "chap: the target's own credentials (mutual CHAP)"),
		discovery:   fs.Bool("discovery", false, "chap: discovery sessions' CHAP"),
		initiators:  fs.String("initiators", "", "add-target: the initiators admitted, comma-separated (default: everyone)"),
		asJSON:      fs.Bool("json", false, "ls, sessions, luns, reload --dry-run: print the API's JSON instead of a table"),
	}
}

// adminVerb is the client of the administration API (package admin).
func adminVerb(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("admin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := newAdminFlags(fs)
	fs.Usage = func() {} // --help prints adminUsage and the flags once, below
	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		io.WriteString(stdout, adminUsage+"\nFlags:\n")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return exitOK
	}
	if err != nil || len(pos) == 0 {
		io.WriteString(stderr, adminUsage)
		return exitUsage
	}
	run, ok := adminVerbs[pos[0]]
	if !ok {
		fmt.Fprintf(stderr, "blockwire admin: unknown admin verb %q\n\n", pos[0])
		io.WriteString(stderr, adminUsage)
		return exitUsage
	}
	api, err := newAPIClient(f)
	if err != nil {
		fmt.Fprintln(stderr, "blockwire admin:", err)
		return exitUsage
	}
	for _, p := range []*string{f.file, f.secretFile} {
		if *p != "" {
			if abs, err := filepath.Abs(*p); err == nil {
				*p = abs // the daemon may have another working directory
			}
		}
	}
	return run(&adminCall{pos: pos, f: f, api: api, stdout: stdout, stderr: stderr})
}

// apiClient makes requests of the administration API, over its Unix
// socket or over HTTP with the token.
type apiClient struct {
	base, token string
	where, hint string // what to name when it does not answer, and what to check
	client      *http.Client
}

func newAPIClient(f *adminFlags) (*apiClient, error) {
	c := &apiClient{base: "http://blockwire", client: &http.Client{Timeout: 30 * time.Second}}
	if *f.apiURL != "" {
		b, err := os.ReadFile(*f.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("the API's token: %v (serve --admin-http writes it to its --admin-http-token file)", err)
		}
		c.base, c.token = strings.TrimRight(*f.apiURL, "/"), strings.TrimSpace(string(b))
		c.where, c.hint = "the administration API at "+*f.apiURL, "is blockwire serve running with --admin-http?"
		return c, nil
	}
	sock := *f.sock
	c.client.Transport = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}
	c.where, c.hint = "the administration socket "+sock, "is blockwire serve running with --admin-socket "+sock+"?"
	return c, nil
}

// call makes one request; out receives the answer's JSON.
func (c *apiClient) call(method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.base+path, rd)
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return &unreachable{fmt.Errorf("cannot reach %s (%v): %s", c.where, errors.Unwrap(err), c.hint)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e admin.Error
		json.NewDecoder(resp.Body).Decode(&e)
		return fmt.Errorf("%s", e.Error)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// adminCall is one run of an admin verb: its arguments (the verb first),
// the flags, the API and where to write.
type adminCall struct {
	pos            []string
	f              *adminFlags
	api            *apiClient
	stdout, stderr io.Writer
}

// usage prints admin's usage: the arguments did not fit the verb.
func (c *adminCall) usage() int {
	io.WriteString(c.stderr, adminUsage)
	return exitUsage
}

// post makes a request whose answer is printed as JSON.
func (c *adminCall) post(method, path string, body any) int {
	var res any
	return c.done(res, c.api.call(method, path, body, &res))
}

// done prints the answer as JSON, or the error with its exit code.
func (c *adminCall) done(res any, err error) int {
	if err != nil {
		fmt.Fprintln(c.stderr, "blockwire admin:", err)
		var u *unreachable
		if errors.As(err, &u) {
			return exitUnreachable
		}
		return 1
	}
	b, _ := json.Marshal(res)
	fmt.Fprintln(c.stdout, string(b))
	return exitOK
}

func adminLs(c *adminCall) int {
	var tr admin.Tree
	if err := c.api.call("GET", "/tree", nil, &tr); err != nil {
		return c.done(nil, err)
	}
	if *c.f.asJSON {
		writeJSON(c.stdout, tr)
	} else {
		printTree(c.stdout, tr)
	}
	return exitOK
}

func adminSessions(c *adminCall) int {
	var ss []admin.Session
	if err := c.api.call("GET", "/sessions", nil, &ss); err != nil {
		return c.done(nil, err)
	}
	if *c.f.asJSON {
		writeJSON(c.stdout, append([]admin.Session{}, ss...))
		return exitOK
	}
	tw := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tFABRIC\tTARGET\tINITIATOR\tPORT\tCONNECTIONS\tIN FLIGHT\tREADS\tWRITES")
	for _, s := range ss {
		inflight := 0
		var conns []string
		for _, cn := range s.Connections {
			inflight += cn.InFlight
			conns = append(conns, fmt.Sprintf("%s:%s:%s", cn.ID, cn.Transport, cn.Remote))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n", s.ID, s.Fabric, s.Target, s.Initiator, cmp.Or(s.Port, "-"),
			strings.Join(conns, ","), inflight, s.Commands["read"], s.Commands["write"])
	}
	tw.Flush()
	return exitOK
}

func adminLuns(c *adminCall) int {
	var ls []admin.LUN
	if err := c.api.call("GET", "/luns", nil, &ls); err != nil {
		return c.done(nil, err)
	}
	if *c.f.asJSON {
		writeJSON(c.stdout, append([]admin.LUN{}, ls...))
		return exitOK
	}
	tw := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tLUN\tSIZE\tBLOCK SIZE")
	for _, l := range ls {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\n", l.Target, l.LUN, config.HumanSize(l.Size), l.BlockSize)
	}
	tw.Flush()
	return exitOK
}

func adminDrop(c *adminCall) int {
	if len(c.pos) != 2 {
		return c.usage()
	}
	return c.post("DELETE", "/sessions/"+url.PathEscape(c.pos[1]), nil)
}

func adminAddLUN(c *adminCall) int {
	if len(c.pos) != 3 {
		return c.usage()
	}
	n, err := strconv.ParseUint(c.pos[2], 10, 64)
	if err != nil {
		fmt.Fprintln(c.stderr, "blockwire: LUN:", err)
		return exitUsage
	}
	f := c.f
	return c.post("POST", "/luns", admin.NewLU{Target: c.pos[1], LUN: n, Size: *f.size, File: *f.file, Remote: *f.remoteURL,
		BlockSize: *f.blockSize, ReadOnly: *f.readOnly})
}

func adminRemoveLUN(c *adminCall) int {
	if len(c.pos) != 3 {
		return c.usage()
	}
	return c.post("DELETE", "/targets/"+url.PathEscape(c.pos[1])+"/luns/"+url.PathEscape(c.pos[2])+forceQuery(*c.f.force), nil)
}

func adminResize(c *adminCall) int {
	if len(c.pos) != 4 {
		return c.usage()
	}
	sz, err := config.ParseSize(c.pos[3])
	if err != nil {
		fmt.Fprintln(c.stderr, "blockwire: SIZE:", err)
		return exitUsage
	}
	q := "?size=" + strconv.FormatInt(sz, 10)
	if *c.f.shrink {
		q += "&shrink=true"
	}
	return c.post("POST", "/targets/"+url.PathEscape(c.pos[1])+"/luns/"+url.PathEscape(c.pos[2])+"/resize"+q, nil)
}

func adminAddTarget(c *adminCall) int {
	if len(c.pos) != 2 {
		return c.usage()
	}
	f := c.f
	return c.post("POST", "/targets", admin.NewTarget{Name: c.pos[1], Initiators: splitList(*f.initiators),
		LUNs: []admin.NewLU{{LUN: 0, Size: *f.size, File: *f.file, Remote: *f.remoteURL, BlockSize: *f.blockSize, ReadOnly: *f.readOnly}}})
}

func adminRemoveTarget(c *adminCall) int {
	if len(c.pos) != 2 {
		return c.usage()
	}
	return c.post("DELETE", "/targets/"+url.PathEscape(c.pos[1])+forceQuery(*c.f.force), nil)
}

// adminList sets a target's list: its ACL's plain names
// (set-initiators), or its portals.
func adminList(c *adminCall) int {
	if len(c.pos) != 2 && len(c.pos) != 3 {
		return c.usage()
	}
	list := []string{}
	if len(c.pos) == 3 {
		list = splitList(c.pos[2])
	}
	what := map[string]string{"set-initiators": "initiators", "portals": "portals"}[c.pos[0]]
	return c.post("PUT", "/targets/"+url.PathEscape(c.pos[1])+"/"+what, list)
}

func adminACL(c *adminCall) int {
	ch, code := aclChange(c.pos, *c.f.srpPort, *c.f.from, *c.f.lunList, c.stderr)
	ch.NVMe = *c.f.nvmeHost
	if code != exitOK {
		return code
	}
	return c.post("POST", "/acl", ch)
}

func adminCHAP(c *adminCall) int {
	f, pos := c.f, c.pos
	ch := admin.CHAPChange{Discovery: *f.discovery, Mutual: *f.mutual, Clear: *f.clearCHAP, User: *f.user, SecretFile: *f.secretFile, NVMe: *f.nvmeHost}
	switch {
	case *f.nvmeHost && *f.discovery && len(pos) == 2:
		ch.Initiator = pos[1] // the discovery rules' host entry
	case *f.discovery && len(pos) != 1, !*f.discovery && len(pos) != 2 && len(pos) != 3:
		return c.usage()
	case !*f.discovery:
		ch.Target = pos[1]
		if len(pos) == 3 {
			ch.Initiator = pos[2]
		}
	}
	if *f.secretStdin {
		b, err := io.ReadAll(io.LimitReader(os.Stdin, 4096))
		if err != nil {
			fmt.Fprintln(c.stderr, "blockwire admin: reading the secret:", err)
			return exitError
		}
		ch.Secret = strings.TrimRight(string(b), "\r\n")
	}
	if ch.NVMe {
		if !ch.Clear && (ch.User != "" || (ch.Secret == "") == (ch.SecretFile == "")) {
			fmt.Fprintln(c.stderr, "blockwire admin: chap --nvme needs one of --secret-file or --secret-stdin (a DHHC-1 secret, no --user), or --clear")
			return exitUsage
		}
		return c.post("POST", "/chap", ch)
	}
	if !ch.Clear && (ch.User == "" || (ch.Secret == "") == (ch.SecretFile == "")) {
		fmt.Fprintln(c.stderr, "blockwire admin: chap needs --user and one of --secret-file or --secret-stdin (or --clear)")
		return exitUsage
	}
	return c.post("POST", "/chap", ch)
}

func adminReload(c *adminCall) int {
	f := c.f
	q := url.Values{}
	for k, v := range map[string]bool{"dry_run": *f.dryRun, "shrink": *f.shrink, "force": *f.force} {
		if v {
			q.Set(k, "true")
		}
	}
	var rr admin.ReloadResult
	err := c.api.call("POST", "/reload?"+q.Encode(), nil, &rr)
	if err == nil && *f.dryRun && !*f.asJSON {
		printPlan(c.stdout, rr)
		return exitOK
	}
	return c.done(rr, err)
}

func adminSave(c *adminCall) int {
	path := ""
	if len(c.pos) > 1 {
		var err error
		if path, err = filepath.Abs(c.pos[1]); err != nil {
			return c.done(nil, err)
		}
	}
	return c.post("POST", "/save?path="+url.QueryEscape(path), nil)
}

// unreachable is an administration endpoint that did not answer.
type unreachable struct{ error }

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func forceQuery(force bool) string {
	if force {
		return "?force=true"
	}
	return ""
}

// printPlan prints a dry run's reload for a person: one change a line,
// then what would be refused.
func printPlan(w io.Writer, rr admin.ReloadResult) {
	if len(rr.Changes) == 0 {
		fmt.Fprintln(w, "no changes: the running node already serves what the configuration says")
	}
	for _, c := range rr.Changes {
		fmt.Fprintln(w, "  "+c)
	}
	if len(rr.Refused) > 0 {
		fmt.Fprintln(w, "the reload would be refused as a whole (nothing would change):")
		for _, r := range rr.Refused {
			fmt.Fprintln(w, "  refused: "+r)
		}
	}
}

// aclChange builds the ACL change of an acl-* or *-lun verb.
func aclChange(pos []string, srp bool, from, luns string, stderr io.Writer) (admin.ACLChange, int) {
	n := map[string]int{"acl-add": 3, "acl-remove": 3, "acl-from": 3, "map-lun": 4, "unmap-lun": 4}[pos[0]]
	if len(pos) != n && !(pos[0] == "acl-from" && len(pos) == 4) {
		io.WriteString(stderr, adminUsage)
		return admin.ACLChange{}, exitUsage
	}
	ch := admin.ACLChange{Target: pos[1], Initiator: pos[2], SRP: srp}
	switch pos[0] {
	case "acl-add":
		ch.Add, ch.Map = true, splitList(luns)
		if from != "" {
			f := splitList(from)
			ch.From = &f
		}
	case "acl-remove":
		ch.Remove = true
	case "acl-from":
		f := []string{}
		if len(pos) == 4 {
			f = splitList(pos[3])
		}
		ch.From = &f
	case "map-lun":
		ch.Map = []string{pos[3]}
	case "unmap-lun":
		v, err := strconv.ParseUint(pos[3], 10, 64)
		if err != nil {
			fmt.Fprintln(stderr, "blockwire admin: LUN:", err)
			return ch, exitUsage
		}
		ch.Unmap = &v
	}
	return ch, exitOK
}

// printTree prints what the node serves as a tree, as targetcli's ls does.
func printTree(w io.Writer, tr admin.Tree) {
	fmt.Fprintf(w, "portals: %s\n", strings.Join(tr.Portals, ", "))
	access := func(indent string, a admin.TreeAccess) {
		switch {
		case a.Open:
			fmt.Fprintf(w, "%saccess: every initiator\n", indent)
		default:
			if len(a.Initiators) > 0 {
				fmt.Fprintf(w, "%sinitiators: %s\n", indent, strings.Join(a.Initiators, ", "))
			}
			if a.CHAPUser != "" {
				fmt.Fprintf(w, "%schap: user %s", indent, a.CHAPUser)
				if a.MutualUser != "" {
					fmt.Fprintf(w, ", mutual: user %s", a.MutualUser)
				}
				fmt.Fprintln(w)
			}
			for _, e := range a.ACL {
				kind := "acl"
				if e.SRP {
					kind = "acl (srp)"
				}
				if e.NVMe {
					kind = "acl (nvme host)"
				}
				fmt.Fprintf(w, "%s%s %s\n", indent, kind, e.Initiator)
				if len(e.From) > 0 {
					fmt.Fprintf(w, "%s  from: %s\n", indent, strings.Join(e.From, ", "))
				}
				if len(e.LUNs) > 0 {
					fmt.Fprintf(w, "%s  sees LUNs: %s\n", indent, strings.Join(e.LUNs, ", "))
				} else {
					fmt.Fprintf(w, "%s  sees every LUN\n", indent)
				}
				if e.CHAPUser != "" {
					fmt.Fprintf(w, "%s  chap: user %s\n", indent, e.CHAPUser)
				}
			}
		}
	}
	if tr.Discovery != nil {
		fmt.Fprintln(w, "discovery")
		access("  ", *tr.Discovery)
	}
	for _, t := range tr.Targets {
		fmt.Fprintf(w, "target %s", t.Name)
		if t.Alias != "" {
			fmt.Fprintf(w, " (%s)", t.Alias)
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "  portals: %s\n", strings.Join(t.Portals, ", "))
		if t.NQN != "" {
			fmt.Fprintf(w, "  nvme subsystem: %s (LUN N is namespace N+1)\n", t.NQN)
		}
		access("  ", t.TreeAccess)
		for _, l := range t.LUNs {
			ro := ""
			if l.ReadOnly {
				ro = ", read-only"
			}
			fmt.Fprintf(w, "  lun %d: %s, %s, %d-byte blocks, %s%s\n", l.LUN, l.Backing, config.HumanSize(l.Size), l.BlockSize, l.Cache, ro)
		}
		for _, s := range t.Sessions {
			fmt.Fprintf(w, "  session %s (%s): %s\n", s.ID, s.Fabric, s.Initiator)
		}
	}
}
