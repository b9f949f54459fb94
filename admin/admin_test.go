package admin

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/blockwire/blockwire/scsitarget"
)

// fakeControl records what the API asked for.
type fakeControl struct {
	mu    sync.Mutex
	added []NewLU
	saved []string
}

func (f *fakeControl) Devices() []*scsitarget.Device { return nil }
func (f *fakeControl) AddLU(n NewLU) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.added = append(f.added, n)
	return nil
}
func (f *fakeControl) RemoveLU(string, uint64, bool) error        { return nil }
func (f *fakeControl) ResizeLU(string, uint64, int64, bool) error { return nil }
func (f *fakeControl) AddTarget(n NewTarget) error                { return nil }
func (f *fakeControl) RemoveTarget(string, bool) error            { return nil }
func (f *fakeControl) SetInitiators(string, []string) error       { return nil }
func (f *fakeControl) ChangeACL(ACLChange) error                  { return nil }
func (f *fakeControl) SetCHAP(CHAPChange) error                   { return nil }
func (f *fakeControl) SetPortals(string, []string) error          { return nil }
func (f *fakeControl) Tree() Tree                                 { return Tree{} }
func (f *fakeControl) Reload(ReloadOptions) (ReloadResult, error) {
	return ReloadResult{}, errors.New("no file")
}
func (f *fakeControl) Save(path string) (string, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.saved = append(f.saved, path)
	return path, "", nil
}

func (f *fakeControl) Sessions() []scsitarget.SessionInfo { return nil }
func (f *fakeControl) DropSession(string) bool            { return false }

func (f *fakeControl) calls() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.added), len(f.saved)
}

const token = "0123456789abcdef0123456789abcdef"

// httpAPI serves the API as serve --admin-http does, on a loopback port.
func httpAPI(t *testing.T, dirs ...string) (*fakeControl, string) {
	t.Helper()
	fc := &fakeControl{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := Handler(Options{Control: fc, Dirs: dirs})
	s := httptest.NewUnstartedServer(Protect(h, l.Addr().String(), token))
	s.Listener.Close()
	s.Listener = l
	s.Start()
	t.Cleanup(s.Close)
	return fc, "http://" + l.Addr().String()
}

type req struct {
	method, path, body string
	header             map[string]string
}

func do(t *testing.T, base string, r req) (int, string) {
	t.Helper()
	hr, err := http.NewRequest(r.method, base+r.path, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range r.header {
		if k == "Host" {
			hr.Host = v
		} else {
			hr.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHTTPRefusesWhatABrowserCanSend: every request a hostile web page
// can make a local browser send — a "simple" cross-site POST with a
// text/plain body, a request after DNS rebinding (a foreign Host), one
// with a foreign Origin, one without the per-run token — is refused, and
// the control sees none of them (POST /luns with a path to any
// file was obeyed).
func TestHTTPRefusesWhatABrowserCanSend(t *testing.T) {
	dir := t.TempDir()
	fc, base := httpAPI(t, dir)
	lun := `{"target":"iqn.x","lun":1,"file":"` + filepath.Join(dir, "x.img") + `"}`
	auth := "Bearer " + token
	for _, c := range []struct {
		name string
		r    req
		want int
	}{
		{"cross-site form post", req{"POST", "/luns", lun, map[string]string{"Content-Type": "text/plain", "Origin": "http://evil.example"}}, http.StatusForbidden},
		{"text/plain even with the token", req{"POST", "/luns", lun, map[string]string{"Content-Type": "text/plain", "Authorization": auth}}, http.StatusUnsupportedMediaType},
		{"no content type", req{"POST", "/save", "", map[string]string{"Authorization": auth}}, http.StatusUnsupportedMediaType},
		{"DNS rebinding", req{"POST", "/luns", lun, map[string]string{"Host": "evil.example:80", "Content-Type": "application/json", "Authorization": auth}}, http.StatusMisdirectedRequest},
		{"DNS rebinding GET", req{"GET", "/sessions", "", map[string]string{"Host": "rebind.evil.example", "Authorization": auth}}, http.StatusMisdirectedRequest},
		{"foreign origin", req{"POST", "/luns", lun, map[string]string{"Origin": "http://evil.example", "Content-Type": "application/json", "Authorization": auth}}, http.StatusForbidden},
		{"no token", req{"POST", "/luns", lun, map[string]string{"Content-Type": "application/json"}}, http.StatusUnauthorized},
		{"no token GET", req{"GET", "/sessions", "", nil}, http.StatusUnauthorized},
		{"wrong token", req{"POST", "/luns", lun, map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + strings.Repeat("0", len(token))}}, http.StatusUnauthorized},
	} {
		if code, body := do(t, base, c.r); code != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.want)
		}
	}
	if a, s := fc.calls(); a != 0 || s != 0 {
		t.Fatalf("refused requests reached the control: %d adds, %d saves", a, s)
	}
	// The same request, made properly, goes through.
	ok := map[string]string{"Content-Type": "application/json; charset=utf-8", "Authorization": auth}
	if code, body := do(t, base, req{"POST", "/luns", lun, ok}); code != http.StatusOK {
		t.Fatalf("proper request: %d %s", code, body)
	}
	if code, body := do(t, base, req{"GET", "/sessions", "", map[string]string{"Authorization": auth, "Host": strings.Replace(strings.TrimPrefix(base, "http://"), "127.0.0.1", "localhost", 1)}}); code != http.StatusOK || strings.TrimSpace(body) != "[]" {
		t.Fatalf("GET /sessions via localhost: %d %q", code, body)
	}
}

// TestPathsOnlyInConfiguredDirectories: LUN files and save destinations
// named through the API must lie in a directory the configuration names
// (no "..", no symbolic link out of it); without any, no path is taken.
func TestPathsOnlyInConfiguredDirectories(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	fc, base := httpAPI(t, dir)
	hdr := map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + token}
	for _, p := range []string{"/etc/passwd", filepath.Join(dir, "..", filepath.Base(outside), "x.img"),
		filepath.Join(dir, "escape", "x.img"), "relative.img", filepath.Join(outside, "x.img")} {
		code, body := do(t, base, req{"POST", "/luns", `{"target":"iqn.x","lun":1,"file":"` + p + `"}`, hdr})
		if code != http.StatusForbidden {
			t.Errorf("LUN file %s: %d %s", p, code, body)
		}
		code, body = do(t, base, req{"POST", "/targets", `{"name":"iqn.y","luns":[{"lun":0,"file":"` + p + `"}]}`, hdr})
		if code != http.StatusForbidden {
			t.Errorf("target LUN file %s: %d %s", p, code, body)
		}
		code, body = do(t, base, req{"POST", "/save?path=" + p, "", hdr})
		if code != http.StatusForbidden {
			t.Errorf("save to %s: %d %s", p, code, body)
		}
	}
	if a, s := fc.calls(); a != 0 || s != 0 {
		t.Fatalf("refused paths reached the control: %d adds, %d saves", a, s)
	}
	in := filepath.Join(dir, "sub", "..", "ok.img")
	if code, body := do(t, base, req{"POST", "/luns", `{"target":"iqn.x","lun":1,"file":"` + in + `"}`, hdr}); code != http.StatusOK {
		t.Fatalf("file inside: %d %s", code, body)
	}
	if code, body := do(t, base, req{"POST", "/save", "", hdr}); code != http.StatusOK {
		t.Fatalf("save to the configuration's own file: %d %s", code, body)
	}
	// No directory configured: no path at all.
	fc2, base2 := httpAPI(t)
	if code, _ := do(t, base2, req{"POST", "/luns", `{"target":"iqn.x","lun":1,"file":"` + in + `"}`, hdr}); code != http.StatusForbidden {
		t.Fatalf("no directories configured: %d", code)
	}
	if a, _ := fc2.calls(); a != 0 {
		t.Fatal("reached the control")
	}
}
