package main

import (
	"bytes"
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
  sessions                          every fabric's sessions (iSCSI, iSER, SRP), connections, commands in flight
  drop ID                           end a session (its ID: an iSCSI TSIH, srp-N)
  luns                              every target's LUNs
  add-lun TARGET LUN (--size S | --file F | --remote URL) [--block-size N] [--read-only]
  remove-lun TARGET LUN [--force]  a LUN with sessions or commands in progress needs --force
  resize TARGET LUN SIZE [--shrink] connected initiators get CAPACITY DATA HAS CHANGED;
                                    a smaller size needs --shrink (the data past it is lost)
  add-target NAME (--size S | --file F | --remote URL) [--initiators A,B]   with LUN 0
  remove-target NAME [--force]      closes its sessions (which needs --force)
  set-initiators TARGET [A,B,...]   the ACL for logins from now on (none: everyone)
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

// adminVerbs are the verbs admin knows.
var adminVerbs = map[string]bool{"sessions": true, "drop": true, "luns": true, "add-lun": true, "remove-lun": true, "resize": true,
	"add-target": true, "remove-target": true, "set-initiators": true, "reload": true, "save": true}

// adminVerb is the client of the administration API (package admin).
func adminVerb(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("admin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	defSock := os.Getenv("BLOCKWIRE_ADMIN_SOCKET")
	if defSock == "" {
		defSock = defaultAdminSocket
	}
	sock := fs.String("socket", defSock, "the administration socket (or BLOCKWIRE_ADMIN_SOCKET)")
	apiURL := fs.String("url", "", "the administration API over HTTP (serve --admin-http), instead of the socket")
	tokenFile := fs.String("token-file", node.DefaultTokenFile(), "with --url: the file holding serve's token")
	size := fs.String("size", "", "add-lun: an in-memory LUN of this size")
	file := fs.String("file", "", "add-lun: a file-backed LUN")
	remoteURL := fs.String("remote", "", "add-lun: another target's LUN (gateway)")
	blockSize := fs.Int("block-size", 0, "add-lun: logical block size")
	readOnly := fs.Bool("read-only", false, "add-lun: write-protected")
	shrink := fs.Bool("shrink", false, "resize, reload: allow a smaller size (the data past it is lost; a reload never truncates a file)")
	force := fs.Bool("force", false, "remove-lun, remove-target, reload: allow removing or replacing what is in use, replacing in-memory LUNs, and the file's side of a conflict with live changes")
	dryRun := fs.Bool("dry-run", false, "reload: print what would change, change nothing")
	initiators := fs.String("initiators", "", "add-target: the initiators admitted, comma-separated (default: everyone)")
	asJSON := fs.Bool("json", false, "sessions, luns: print the API's JSON instead of a table")
	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		io.WriteString(stdout, adminUsage)
		return exitOK
	}
	if err != nil || len(pos) == 0 {
		io.WriteString(stderr, adminUsage)
		return exitUsage
	}
	if !adminVerbs[pos[0]] {
		fmt.Fprintf(stderr, "blockwire admin: unknown admin verb %q\n\n", pos[0])
		io.WriteString(stderr, adminUsage)
		return exitUsage
	}
	base, token := "http://blockwire", ""
	client := &http.Client{Timeout: 30 * time.Second}
	if *apiURL != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "blockwire admin: the API's token: %v (serve --admin-http writes it to its --admin-http-token file)\n", err)
			return exitUsage
		}
		base, token = strings.TrimRight(*apiURL, "/"), strings.TrimSpace(string(b))
	} else {
		client.Transport = &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", *sock)
			}}
	}
	call := func(method, path string, body, out any) error {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, base+path, rd)
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			if *apiURL == "" {
				return &unreachable{fmt.Errorf("cannot reach the administration socket %s (%v): is blockwire serve running with --admin-socket %s?", *sock, errors.Unwrap(err), *sock)}
			}
			return &unreachable{fmt.Errorf("cannot reach the administration API at %s (%v): is blockwire serve running with --admin-http?", *apiURL, errors.Unwrap(err))}
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			var e admin.Error
			json.NewDecoder(resp.Body).Decode(&e)
			return fmt.Errorf("%s", e.Error)
		}
		return json.NewDecoder(resp.Body).Decode(out)
	}
	if *file != "" {
		if abs, err := filepath.Abs(*file); err == nil {
			*file = abs // the daemon may have another working directory
		}
	}
	need := func(n int) bool {
		if len(pos) != n {
			io.WriteString(stderr, adminUsage)
			return false
		}
		return true
	}
	var res any
	switch pos[0] {
	case "sessions":
		var ss []admin.Session
		if err = call("GET", "/sessions", nil, &ss); err == nil && *asJSON {
			writeJSON(stdout, append([]admin.Session{}, ss...))
			return exitOK
		}
		if err == nil {
			tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tFABRIC\tTARGET\tINITIATOR\tPORT\tCONNECTIONS\tIN FLIGHT\tREADS\tWRITES")
			for _, s := range ss {
				inflight := 0
				conns := ""
				for i, c := range s.Connections {
					inflight += c.InFlight
					if i > 0 {
						conns += ","
					}
					conns += fmt.Sprintf("%s:%s:%s", c.ID, c.Transport, c.Remote)
				}
				port := s.Port
				if port == "" {
					port = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n", s.ID, s.Fabric, s.Target, s.Initiator, port, conns, inflight, s.Commands["read"], s.Commands["write"])
			}
			tw.Flush()
			return exitOK
		}
	case "drop":
		if !need(2) {
			return exitUsage
		}
		err = call("DELETE", "/sessions/"+url.PathEscape(pos[1]), nil, &res)
	case "luns":
		var ls []admin.LUN
		if err = call("GET", "/luns", nil, &ls); err == nil && *asJSON {
			writeJSON(stdout, append([]admin.LUN{}, ls...))
			return exitOK
		}
		if err == nil {
			tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TARGET\tLUN\tSIZE\tBLOCK SIZE")
			for _, l := range ls {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", l.Target, l.LUN, l.Size, l.BlockSize)
			}
			tw.Flush()
			return exitOK
		}
	case "add-lun":
		if !need(3) {
			return exitUsage
		}
		n, perr := strconv.ParseUint(pos[2], 10, 64)
		if perr != nil {
			fmt.Fprintln(stderr, "blockwire: LUN:", perr)
			return exitUsage
		}
		err = call("POST", "/luns", admin.NewLU{Target: pos[1], LUN: n, Size: *size, File: *file, Remote: *remoteURL,
			BlockSize: *blockSize, ReadOnly: *readOnly}, &res)
	case "remove-lun":
		if !need(3) {
			return exitUsage
		}
		err = call("DELETE", "/targets/"+url.PathEscape(pos[1])+"/luns/"+url.PathEscape(pos[2])+forceQuery(*force), nil, &res)
	case "resize":
		if !need(4) {
			return exitUsage
		}
		sz, perr := config.ParseSize(pos[3])
		if perr != nil {
			fmt.Fprintln(stderr, "blockwire: SIZE:", perr)
			return exitUsage
		}
		q := "?size=" + strconv.FormatInt(sz, 10)
		if *shrink {
			q += "&shrink=true"
		}
		err = call("POST", "/targets/"+url.PathEscape(pos[1])+"/luns/"+url.PathEscape(pos[2])+"/resize"+q, nil, &res)
	case "add-target":
		if !need(2) {
			return exitUsage
		}
		nt := admin.NewTarget{Name: pos[1], Initiators: splitList(*initiators),
			LUNs: []admin.NewLU{{LUN: 0, Size: *size, File: *file, Remote: *remoteURL, BlockSize: *blockSize, ReadOnly: *readOnly}}}
		err = call("POST", "/targets", nt, &res)
	case "remove-target":
		if !need(2) {
			return exitUsage
		}
		err = call("DELETE", "/targets/"+url.PathEscape(pos[1])+forceQuery(*force), nil, &res)
	case "set-initiators":
		if len(pos) != 2 && len(pos) != 3 {
			io.WriteString(stderr, adminUsage)
			return exitUsage
		}
		list := []string{}
		if len(pos) == 3 {
			list = splitList(pos[2])
		}
		err = call("PUT", "/targets/"+url.PathEscape(pos[1])+"/initiators", list, &res)
	case "reload":
		q := url.Values{}
		for k, v := range map[string]bool{"dry_run": *dryRun, "shrink": *shrink, "force": *force} {
			if v {
				q.Set(k, "true")
			}
		}
		var rr admin.ReloadResult
		if err = call("POST", "/reload?"+q.Encode(), nil, &rr); err == nil && *dryRun && !*asJSON {
			printPlan(stdout, rr)
			return exitOK
		}
		res = rr
	case "save":
		path := ""
		if len(pos) > 1 {
			if path, err = filepath.Abs(pos[1]); err != nil {
				break
			}
		}
		err = call("POST", "/save?path="+url.QueryEscape(path), nil, &res)
	default:
		io.WriteString(stderr, adminUsage)
		return exitUsage
	}
	if err != nil {
		fmt.Fprintln(stderr, "blockwire admin:", err)
		var u *unreachable
		if errors.As(err, &u) {
			return exitUnreachable
		}
		return 1
	}
	b, _ := json.Marshal(res)
	fmt.Fprintln(stdout, string(b))
	return exitOK
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
