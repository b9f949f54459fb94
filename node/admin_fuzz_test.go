package node_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"

	"github.com/blockwire/blockwire/admin"
	"github.com/blockwire/blockwire/config"
	"github.com/blockwire/blockwire/node"
	"github.com/blockwire/blockwire/node/nodetest"
)

// FuzzAdminAPI drives a running node's administration API with any
// request body: adding LUNs and targets, setting an ACL, resizing and
// removing. Each request is answered — done, or refused with a 4xx — never
// a panic or a 5xx, and the node still lists its LUNs afterwards. (Bodies
// naming a remote LUN are skipped: the node would dial the address.)
func FuzzAdminAPI(f *testing.F) {
	dir := f.TempDir()
	cfg := &config.Config{Listen: []string{"127.0.0.1:0"},
		Targets: []config.Target{{Name: diskA, LUNs: []config.LUN{{ID: 0, Size: "16MiB"}}}}}
	n := nodetest.Start(f, cfg, node.Options{})
	h := admin.Handler(admin.Options{Control: n.Admin(), Dirs: []string{dir}})

	f.Add(uint8(0), diskA, []byte(`{"target":"`+diskA+`","lun":1,"size":"1MiB"}`))
	f.Add(uint8(0), diskA, []byte(`{"target":"`+diskA+`","lun":2,"file":"`+dir+`/x.img","size":"1MiB","block_size":4096}`))
	f.Add(uint8(0), diskA, []byte(`{"target":"`+diskA+`","lun":18446744073709551615,"size":"-1","block_size":3}`))
	f.Add(uint8(1), diskB, []byte(`{"name":"`+diskB+`","initiators":["iqn.x"],"luns":[{"lun":0,"size":"1MiB"},{"lun":0,"size":"1MiB"}]}`))
	f.Add(uint8(1), "", []byte(`{"name":"not an iqn","luns":[]}`))
	f.Add(uint8(2), diskA, []byte(`["iqn.2026-11.org.example:i", ""]`))
	f.Add(uint8(3), diskA, []byte(`1`))
	f.Add(uint8(3), diskA, []byte(`1049088`))
	f.Add(uint8(3), diskA, []byte(`4611686018427387904`))
	f.Add(uint8(4), diskA, []byte(`0`))
	f.Add(uint8(5), diskA, []byte{})
	f.Fuzz(func(t *testing.T, op uint8, target string, body []byte) {
		if len(body) > 4096 {
			return
		}
		var nl admin.NewLU
		var nt admin.NewTarget
		if json.Unmarshal(body, &nl) == nil && nl.Remote != "" {
			return
		}
		if json.Unmarshal(body, &nt) == nil && slices.ContainsFunc(nt.LUNs, func(l admin.NewLU) bool { return l.Remote != "" }) {
			return
		}
		tgt := url.PathEscape(target)
		var req *http.Request
		switch op % 6 {
		case 0:
			req = httptest.NewRequest("POST", "/luns", bytes.NewReader(body))
		case 1:
			req = httptest.NewRequest("POST", "/targets", bytes.NewReader(body))
		case 2:
			req = httptest.NewRequest("PUT", "/targets/"+tgt+"/initiators", bytes.NewReader(body))
		case 3:
			req = httptest.NewRequest("POST", "/targets/"+tgt+"/luns/0/resize?size="+url.QueryEscape(string(body))+"&shrink=true", nil)
		case 4:
			req = httptest.NewRequest("DELETE", "/targets/"+tgt+"/luns/"+url.PathEscape(string(body)), nil)
		case 5:
			req = httptest.NewRequest("DELETE", "/targets/"+tgt, nil)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 {
			t.Fatalf("%s %s %q: %d %s", req.Method, req.URL, body, w.Code, w.Body)
		}
		w = httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/luns", nil))
		var luns []admin.LUN
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &luns) != nil {
			t.Fatalf("GET /luns after %s %s: %d %s", req.Method, req.URL, w.Code, w.Body)
		}
		for _, l := range luns {
			if l.Size <= 0 || l.BlockSize <= 0 || l.Size%int64(l.BlockSize) != 0 {
				t.Fatalf("after %s %s %q: LUN %+v is not whole blocks", req.Method, req.URL, body, l)
			}
		}
		// Back to the first target and its LUN 0 alone, so runs do not
		// pile up LUNs.
		for _, l := range luns {
			switch {
			case l.Target != diskA:
				n.RemoveTarget(l.Target, true)
			case l.LUN != 0:
				n.RemoveLU(l.Target, l.LUN, true)
			}
		}
		if len(luns) == 0 || !slices.ContainsFunc(luns, func(l admin.LUN) bool { return l.Target == diskA && l.LUN == 0 }) {
			// The first target or its LUN went: put them back.
			n.AddTarget(admin.NewTarget{Name: diskA, LUNs: []admin.NewLU{{Target: diskA, LUN: 0, Size: "16MiB"}}})
			n.AddLU(admin.NewLU{Target: diskA, LUN: 0, Size: "16MiB"})
		}
		n.SetInitiators(diskA, nil)
	})
}
