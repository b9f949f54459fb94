// Package admin is blockwire's runtime administration API: JSON over HTTP
// on a Unix socket (only local users with access to the socket file can
// use it). It lists sessions with their connections, negotiated values and
// commands in flight; drops a session; lists, adds and removes LUNs and
// resizes them — connected initiators see the change through the unit
// attentions the SCSI core queues (REPORTED LUNS DATA HAS CHANGED,
// CAPACITY DATA HAS CHANGED). The `blockwire admin` verbs are its client.
package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"

	"github.com/blockwire/blockwire/scsitarget"
)

// Session is one session as the API shows it, on any fabric: an iSCSI or
// iSER session or an SRP I_T nexus.
type Session struct {
	// Fabric is "iscsi", "iser" or "srp"; ID names the session to
	// DELETE /sessions/{id} (an iSCSI TSIH, "srp-N").
	Fabric    string `json:"fabric"`
	ID        string `json:"id"`
	Target    string `json:"target"`
	Initiator string `json:"initiator"`
	// Port is the iSCSI ISID (SRP: empty; its initiator is a port).
	Port        string                `json:"port,omitempty"`
	Discovery   bool                  `json:"discovery,omitempty"`
	Params      map[string]string     `json:"params,omitempty"`
	Connections []scsitarget.ConnInfo `json:"connections"`
	Commands    map[string]uint64     `json:"commands,omitempty"`
}

// LUN is one logical unit.
type LUN struct {
	Target    string `json:"target"`
	LUN       uint64 `json:"lun"`
	Size      int64  `json:"size"`
	BlockSize int    `json:"block_size"`
}

// NewLU is a LUN to add: exactly one of Size (in memory), File or Remote.
type NewLU struct {
	Target    string `json:"target"`
	LUN       uint64 `json:"lun"`
	Size      string `json:"size,omitempty"`
	File      string `json:"file,omitempty"`
	Remote    string `json:"remote,omitempty"`
	BlockSize int    `json:"block_size,omitempty"`
	ReadOnly  bool   `json:"read_only,omitempty"`
}

// NewTarget is a target to add, with its ACL and at least one LUN.
type NewTarget struct {
	Name       string   `json:"name"`
	Alias      string   `json:"alias,omitempty"`
	Initiators []string `json:"initiators,omitempty"`
	LUNs       []NewLU  `json:"luns"`
}

// Control changes the running configuration; every change is also kept in
// the configuration Save writes back.
type Control interface {
	Devices() []*scsitarget.Device
	// Sessions are every fabric's; DropSession ends one by its ID.
	Sessions() []scsitarget.SessionInfo
	DropSession(id string) bool
	AddLU(NewLU) error
	// RemoveLU and RemoveTarget refuse (ErrRefused) what has sessions or
	// commands in progress unless forced.
	RemoveLU(target string, lun uint64, force bool) error
	// ResizeLU refuses (ErrRefused) a smaller size unless shrink.
	ResizeLU(target string, lun uint64, size int64, shrink bool) error
	AddTarget(NewTarget) error
	RemoveTarget(name string, force bool) error
	SetInitiators(target string, initiators []string) error
	// ChangeACL adds, changes or removes one initiator's ACL entry.
	ChangeACL(ACLChange) error
	// SetCHAP sets or clears CHAP or mutual CHAP: a target's, one ACL
	// entry's, or discovery's.
	SetCHAP(CHAPChange) error
	// SetPortals sets the iSCSI portals a target is served on (none:
	// every portal).
	SetPortals(target string, portals []string) error
	// Tree is what the node serves, for "admin ls".
	Tree() Tree
	// Reload applies the configuration file's changes (as SIGHUP does),
	// or with DryRun says what they would be.
	Reload(ReloadOptions) (ReloadResult, error)
	// Save writes the running configuration to its file (or to path)
	// and returns where, and where the file it replaced was kept ("":
	// there was none).
	Save(path string) (saved, backup string, err error)
}

// ErrRefused is the error, wrapped, of a change refused for the data or
// the sessions it would cost (409): nothing changed, and the message names
// the LUN, the reason and the flag that allows it.
var ErrRefused = errors.New("refused")

// ReloadOptions are a reload's flags.
type ReloadOptions struct {
	// DryRun says what would change, and what would be refused, and
	// changes nothing.
	DryRun bool `json:"dry_run,omitempty"`
	// Shrink lets an in-memory LUN become smaller than it runs (a reload
	// never truncates a file).
	Shrink bool `json:"shrink,omitempty"`
	// Force lets it remove or replace what is in use, replace in-memory
	// LUNs, and take the file's side where it conflicts with live changes.
	Force bool `json:"force,omitempty"`
}

// ReloadResult is what a reload changed, or would change.
type ReloadResult struct {
	DryRun bool `json:"dry_run,omitempty"`
	// Changes are made (or would be) now; Restart waits for a restart.
	Changes []string `json:"changes"`
	Restart []string `json:"restart,omitempty"`
	// Refused is why a dry run's reload would be refused as a whole.
	Refused []string `json:"refused,omitempty"`
}

// ACLChange changes one initiator's entry in a target's ACL (an
// initiator in the target's plain initiators list becomes an entry when
// the change needs one).
type ACLChange struct {
	Target string `json:"target"`
	// Initiator is an iSCSI name, or with SRP an SRP initiator port
	// (ID_EXT:GUID in hex).
	Initiator string `json:"initiator"`
	SRP       bool   `json:"srp,omitempty"`
	// NVMe: Initiator is an NVMe host NQN.
	NVMe bool `json:"nvme,omitempty"`
	// Add creates the entry (refused if it exists); Remove deletes it.
	Add    bool `json:"add,omitempty"`
	Remove bool `json:"remove,omitempty"`
	// From, when not nil, replaces the networks it may log in from
	// (empty: anywhere).
	From *[]string `json:"from,omitempty"`
	// Map adds LUNs to those it sees, each "N" (LUN N as itself) or "M=N"
	// (LUN N seen as M); Unmap removes the LUN it sees as this number. An
	// entry with no LUN mapped sees every LUN.
	Map   []string `json:"map,omitempty"`
	Unmap *uint64  `json:"unmap,omitempty"`
}

// CHAPChange sets or clears CHAP credentials.
type CHAPChange struct {
	// Target is the target ("" with Discovery); Initiator, when set, is
	// the ACL entry whose own CHAP this is.
	Target    string `json:"target,omitempty"`
	Initiator string `json:"initiator,omitempty"`
	Discovery bool   `json:"discovery,omitempty"`
	// Mutual is the target's own credentials (mutual CHAP).
	Mutual bool `json:"mutual,omitempty"`
	// NVMe: Initiator is an NVMe host NQN, and the secret its entry's
	// DH-HMAC-CHAP secret (the DHHC-1 form, no user); with Mutual, the
	// controller's (bidirectional).
	NVMe bool `json:"nvme,omitempty"`
	// Clear removes them; else User with Secret (kept in the node's
	// state, mode 0600) or SecretFile (a file the node reads).
	Clear      bool   `json:"clear,omitempty"`
	User       string `json:"user,omitempty"`
	Secret     string `json:"secret,omitempty"`
	SecretFile string `json:"secret_file,omitempty"`
}

// Tree is what a node serves: its portals, and each target with its
// access rules, LUNs and sessions ("admin ls").
type Tree struct {
	Portals   []string     `json:"portals"`
	Discovery *TreeAccess  `json:"discovery,omitempty"`
	Targets   []TreeTarget `json:"targets"`
}

// TreeAccess is who may log in: the plain list, the ACL entries, CHAP.
type TreeAccess struct {
	// Open: anyone may log in (no list, no ACL, no CHAP).
	Open       bool      `json:"open"`
	Initiators []string  `json:"initiators,omitempty"`
	ACL        []TreeACL `json:"acl,omitempty"`
	CHAPUser   string    `json:"chap_user,omitempty"`
	MutualUser string    `json:"mutual_chap_user,omitempty"`
}

// TreeACL is one ACL entry.
type TreeACL struct {
	Initiator string   `json:"initiator"`
	SRP       bool     `json:"srp,omitempty"`
	NVMe      bool     `json:"nvme,omitempty"` // Initiator is an NVMe host NQN
	From      []string `json:"from,omitempty"`
	// LUNs are the LUNs it sees ("M=N": target LUN N seen as M); none:
	// every LUN.
	LUNs     []string `json:"luns,omitempty"`
	CHAPUser string   `json:"chap_user,omitempty"`
}

// TreeTarget is one target.
type TreeTarget struct {
	Name    string   `json:"name"`
	Alias   string   `json:"alias,omitempty"`
	Portals []string `json:"portals"`
	// NQN is the NVM subsystem the target is served as over NVMe (empty:
	// not served over NVMe).
	NQN string `json:"nqn,omitempty"`
	TreeAccess
	LUNs     []TreeLUN     `json:"luns"`
	Sessions []TreeSession `json:"sessions"`
}

// TreeLUN is one LUN: its backing store and what it looks like.
type TreeLUN struct {
	LUN uint64 `json:"lun"`
	// Backing is "memory", a file's path, "remote URL" or "rbd IMAGE".
	Backing   string `json:"backing"`
	Size      int64  `json:"size"`
	BlockSize int    `json:"block_size"`
	ReadOnly  bool   `json:"read_only,omitempty"`
	// Cache is "write-back" or "write-through".
	Cache string `json:"cache"`
}

// TreeSession is a logged-in session of a target.
type TreeSession struct {
	ID        string `json:"id"`
	Fabric    string `json:"fabric"`
	Initiator string `json:"initiator"`
}

// Options connect the API to the running process.
type Options struct {
	Control Control
	// Dirs are the directories in which the API may name files: LUN
	// backing files and save destinations. Empty: none (save then writes
	// only the configuration's own file).
	Dirs []string
}

// Handler serves the API:
//
//	GET    /sessions                            the sessions
//	DELETE /sessions/{id}                       drop a session (iSCSI TSIH, srp-N)
//	GET    /luns                                every target's LUNs
//	POST   /luns                                add a LUN (NewLU)
//	DELETE /targets/{target}/luns/{lun}[?force=true]  remove a LUN
//	POST   /targets/{target}/luns/{lun}/resize?size=BYTES[&shrink=true]
//	POST   /targets                             add a target (NewTarget)
//	DELETE /targets/{target}[?force=true]       remove a target
//	PUT    /targets/{target}/initiators         set the ACL (a JSON list; empty: everyone)
//	GET    /tree                                what the node serves (admin ls)
//	POST   /acl                                 change an ACL entry (ACLChange)
//	POST   /chap                                set or clear CHAP (CHAPChange)
//	PUT    /targets/{target}/portals            the target's iSCSI portals (a JSON list; empty: all)
//	POST   /reload[?dry_run=true&shrink=true&force=true]  apply the configuration file's changes
//	POST   /save?path=FILE                      write the running configuration
func Handler(o Options) http.Handler {
	c := o.Control
	mux := http.NewServeMux()
	mux.HandleFunc("GET /sessions", func(w http.ResponseWriter, r *http.Request) {
		out := []Session{}
		for _, si := range c.Sessions() {
			s := Session{Fabric: si.Fabric, ID: si.ID, Target: si.Target, Initiator: si.Initiator, Port: si.Port,
				Discovery: si.Discovery, Params: si.Params, Connections: si.Conns}
			if s.Connections == nil {
				s.Connections = []scsitarget.ConnInfo{}
			}
			if si.Stats != nil {
				s.Commands = map[string]uint64{"read": si.Stats.Commands[scsitarget.ClassRead].Load(),
					"write": si.Stats.Commands[scsitarget.ClassWrite].Load(), "other": si.Stats.Commands[scsitarget.ClassOther].Load()}
			}
			out = append(out, s)
		}
		reply(w, out)
	})
	mux.HandleFunc("DELETE /sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !c.DropSession(id) {
			fail(w, http.StatusNotFound, fmt.Errorf("no session %q", id))
			return
		}
		reply(w, map[string]string{"dropped": id})
	})
	mux.HandleFunc("GET /luns", func(w http.ResponseWriter, r *http.Request) {
		out := []LUN{}
		for _, d := range c.Devices() {
			for _, n := range d.LUNs() {
				if lu := d.LU(n); lu != nil {
					out = append(out, lunOf(d.Name(), lu))
				}
			}
		}
		sort.Slice(out, func(i, j int) bool {
			return out[i].Target < out[j].Target || out[i].Target == out[j].Target && out[i].LUN < out[j].LUN
		})
		reply(w, out)
	})
	mux.HandleFunc("POST /luns", func(w http.ResponseWriter, r *http.Request) {
		var req NewLU
		if !decode(w, r, &req) || !pathsOK(w, o.Dirs, req) {
			return
		}
		done(w, c.AddLU(req), map[string]any{"added": req})
	})
	mux.HandleFunc("DELETE /targets/{target}/luns/{lun}", func(w http.ResponseWriter, r *http.Request) {
		n, ok := lunNumber(w, r)
		if ok {
			done(w, c.RemoveLU(r.PathValue("target"), n, flag(r, "force")), map[string]any{"removed": n})
		}
	})
	mux.HandleFunc("POST /targets/{target}/luns/{lun}/resize", func(w http.ResponseWriter, r *http.Request) {
		n, ok := lunNumber(w, r)
		if !ok {
			return
		}
		size, err := strconv.ParseInt(r.URL.Query().Get("size"), 10, 64)
		if err != nil || size <= 0 {
			fail(w, http.StatusBadRequest, errors.New("size: a positive number of bytes"))
			return
		}
		done(w, c.ResizeLU(r.PathValue("target"), n, size, flag(r, "shrink")), map[string]any{"resized": n, "size": size})
	})
	mux.HandleFunc("POST /targets", func(w http.ResponseWriter, r *http.Request) {
		var req NewTarget
		if decode(w, r, &req) && pathsOK(w, o.Dirs, req.LUNs...) {
			done(w, c.AddTarget(req), map[string]any{"added": req.Name})
		}
	})
	mux.HandleFunc("DELETE /targets/{target}", func(w http.ResponseWriter, r *http.Request) {
		done(w, c.RemoveTarget(r.PathValue("target"), flag(r, "force")), map[string]any{"removed": r.PathValue("target")})
	})
	mux.HandleFunc("PUT /targets/{target}/initiators", func(w http.ResponseWriter, r *http.Request) {
		var list []string
		if decode(w, r, &list) {
			done(w, c.SetInitiators(r.PathValue("target"), list), map[string]any{"initiators": list})
		}
	})
	mux.HandleFunc("GET /tree", func(w http.ResponseWriter, r *http.Request) {
		reply(w, c.Tree())
	})
	mux.HandleFunc("POST /acl", func(w http.ResponseWriter, r *http.Request) {
		var req ACLChange
		if decode(w, r, &req) {
			done(w, c.ChangeACL(req), map[string]any{"acl": req})
		}
	})
	mux.HandleFunc("POST /chap", func(w http.ResponseWriter, r *http.Request) {
		var req CHAPChange
		if !decode(w, r, &req) {
			return
		}
		if req.SecretFile != "" {
			if err := checkPath(o.Dirs, req.SecretFile); err != nil {
				fail(w, http.StatusForbidden, err)
				return
			}
		}
		err := c.SetCHAP(req)
		req.Secret = "" // never echoed
		done(w, err, map[string]any{"chap": req})
	})
	mux.HandleFunc("PUT /targets/{target}/portals", func(w http.ResponseWriter, r *http.Request) {
		var list []string
		if decode(w, r, &list) {
			done(w, c.SetPortals(r.PathValue("target"), list), map[string]any{"portals": list})
		}
	})
	mux.HandleFunc("POST /reload", func(w http.ResponseWriter, r *http.Request) {
		res, err := c.Reload(ReloadOptions{DryRun: flag(r, "dry_run"), Shrink: flag(r, "shrink"), Force: flag(r, "force")})
		if res.Changes == nil {
			res.Changes = []string{}
		}
		done(w, err, res)
	})
	mux.HandleFunc("POST /save", func(w http.ResponseWriter, r *http.Request) {
		path := r.URL.Query().Get("path")
		if path != "" {
			if err := checkPath(o.Dirs, path); err != nil {
				fail(w, http.StatusForbidden, err)
				return
			}
		}
		saved, backup, err := c.Save(path)
		out := map[string]any{"saved": saved}
		if backup != "" {
			out["backup"] = backup
			out["note"] = "comments and layout of the replaced file are not kept; it is in the backup"
		}
		done(w, err, out)
	})
	return mux
}

// pathsOK answers 403 when a LUN names a file outside dirs.
func pathsOK(w http.ResponseWriter, dirs []string, luns ...NewLU) bool {
	for _, l := range luns {
		if l.File == "" {
			continue
		}
		if err := checkPath(dirs, l.File); err != nil {
			fail(w, http.StatusForbidden, err)
			return false
		}
	}
	return true
}

func lunOf(name string, lu *scsitarget.LU) LUN {
	return LUN{Target: name, LUN: lu.LUN(), Size: int64(lu.Blocks()) * int64(lu.BlockSize()), BlockSize: lu.BlockSize()}
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(v); err != nil {
		fail(w, http.StatusBadRequest, err)
		return false
	}
	return true
}

func lunNumber(w http.ResponseWriter, r *http.Request) (uint64, bool) {
	n, err := strconv.ParseUint(r.PathValue("lun"), 10, 64)
	if err != nil {
		fail(w, http.StatusBadRequest, fmt.Errorf("LUN %q: %w", r.PathValue("lun"), err))
		return 0, false
	}
	return n, true
}

// flag is a query parameter set to true.
func flag(r *http.Request, name string) bool { return r.URL.Query().Get(name) == "true" }

// done answers with v, or with err (409 for a refusal, else 400).
func done(w http.ResponseWriter, err error, v any) {
	if errors.Is(err, ErrRefused) {
		fail(w, http.StatusConflict, err)
		return
	}
	if err != nil {
		fail(w, http.StatusBadRequest, err)
		return
	}
	reply(w, v)
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// Error is the body of a failed request.
type Error struct {
	Error string `json:"error"`
}

func fail(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(Error{err.Error()})
}
