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

	iscsitarget "github.com/blockwire/blockwire/iscsi/target"
	"github.com/blockwire/blockwire/target"
)

// Session is one session as the API shows it.
type Session struct {
	TSIH        uint16                 `json:"tsih"`
	Target      string                 `json:"target"`
	Initiator   string                 `json:"initiator"`
	ISID        string                 `json:"isid"`
	Discovery   bool                   `json:"discovery"`
	Params      map[string]string      `json:"params,omitempty"`
	Connections []iscsitarget.ConnInfo `json:"connections"`
	Commands    map[string]uint64      `json:"commands,omitempty"`
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

// Options connect the API to the running process.
type Options struct {
	ISCSI   *iscsitarget.Server
	Devices func() []*target.Device
	// Build makes the logical unit for an add request (the same code that
	// builds the configuration's LUNs).
	Build func(NewLU) (*target.LU, error)
}

// Handler serves the API:
//
//	GET    /sessions                       the sessions
//	DELETE /sessions/{tsih}                drop a session
//	GET    /luns                           every target's LUNs
//	POST   /luns                           add a LUN (NewLU)
//	DELETE /targets/{target}/luns/{lun}    remove a LUN
//	POST   /targets/{target}/luns/{lun}/resize?size=BYTES
func Handler(o Options) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /sessions", func(w http.ResponseWriter, r *http.Request) {
		var out []Session
		for _, si := range o.ISCSI.Sessions() {
			s := Session{TSIH: si.TSIH, Target: si.Target, Initiator: si.Initiator, ISID: fmt.Sprintf("%x", si.ISID),
				Discovery: si.Discovery, Params: si.Params, Connections: si.Conns}
			if si.Stats != nil {
				s.Commands = map[string]uint64{"read": si.Stats.Commands[target.ClassRead].Load(),
					"write": si.Stats.Commands[target.ClassWrite].Load(), "other": si.Stats.Commands[target.ClassOther].Load()}
			}
			out = append(out, s)
		}
		reply(w, out)
	})
	mux.HandleFunc("DELETE /sessions/{tsih}", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseUint(r.PathValue("tsih"), 0, 16)
		if err != nil {
			fail(w, http.StatusBadRequest, fmt.Errorf("tsih: %w", err))
			return
		}
		if !o.ISCSI.DropSession(uint16(n)) {
			fail(w, http.StatusNotFound, fmt.Errorf("no session with TSIH %d", n))
			return
		}
		reply(w, map[string]string{"dropped": strconv.FormatUint(n, 10)})
	})
	mux.HandleFunc("GET /luns", func(w http.ResponseWriter, r *http.Request) {
		out := []LUN{}
		for _, d := range o.Devices() {
			for _, n := range d.LUNs() {
				if lu := d.LU(n); lu != nil {
					out = append(out, LUN{Target: d.Name(), LUN: n, Size: int64(lu.Blocks()) * int64(lu.BlockSize()), BlockSize: lu.BlockSize()})
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
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		d := device(o, req.Target)
		if d == nil {
			fail(w, http.StatusNotFound, fmt.Errorf("no target %q", req.Target))
			return
		}
		if d.LU(req.LUN) != nil {
			fail(w, http.StatusConflict, fmt.Errorf("%s already has LUN %d", req.Target, req.LUN))
			return
		}
		lu, err := o.Build(req)
		if err == nil {
			if err = d.AddLU(lu); err != nil {
				lu.Close()
			}
		}
		if err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		reply(w, LUN{Target: req.Target, LUN: req.LUN, Size: int64(lu.Blocks()) * int64(lu.BlockSize()), BlockSize: lu.BlockSize()})
	})
	mux.HandleFunc("DELETE /targets/{target}/luns/{lun}", func(w http.ResponseWriter, r *http.Request) {
		d, n, ok := lunOf(w, r, o)
		if !ok {
			return
		}
		if err := d.RemoveLU(n); err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		reply(w, map[string]string{"removed": strconv.FormatUint(n, 10)})
	})
	mux.HandleFunc("POST /targets/{target}/luns/{lun}/resize", func(w http.ResponseWriter, r *http.Request) {
		d, n, ok := lunOf(w, r, o)
		if !ok {
			return
		}
		size, err := strconv.ParseInt(r.URL.Query().Get("size"), 10, 64)
		if err != nil || size <= 0 {
			fail(w, http.StatusBadRequest, errors.New("size: a positive number of bytes"))
			return
		}
		lu := d.LU(n)
		if err := lu.Resize(size); err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		reply(w, LUN{Target: d.Name(), LUN: n, Size: int64(lu.Blocks()) * int64(lu.BlockSize()), BlockSize: lu.BlockSize()})
	})
	return mux
}

func device(o Options, name string) *target.Device {
	for _, d := range o.Devices() {
		if d.Name() == name {
			return d
		}
	}
	return nil
}

func lunOf(w http.ResponseWriter, r *http.Request, o Options) (*target.Device, uint64, bool) {
	d := device(o, r.PathValue("target"))
	if d == nil {
		fail(w, http.StatusNotFound, fmt.Errorf("no target %q", r.PathValue("target")))
		return nil, 0, false
	}
	n, err := strconv.ParseUint(r.PathValue("lun"), 10, 64)
	if err != nil || d.LU(n) == nil {
		fail(w, http.StatusNotFound, fmt.Errorf("%s has no LUN %q", d.Name(), r.PathValue("lun")))
		return nil, 0, false
	}
	return d, n, true
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
