package admin

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/blockwire/blockwire/internal/httpguard"
)

// Protect guards the API on a TCP listener at addr (host:port as it
// listens), where any web page the local user's browser opens can send it
// requests. A request must
//   - name this listener in Host ("localhost" for a loopback host allowed):
//     after DNS rebinding a browser sends the attacker's name (421);
//   - carry no Origin but this listener's own (403);
//   - send Content-Type application/json unless it is a GET or HEAD, which
//     a cross-site form or a "simple" fetch cannot do without a CORS
//     preflight this handler never answers (415);
//   - present the per-run token as "Authorization: Bearer TOKEN" (401),
//     which only a user who can read the daemon's token file knows.
func Protect(h http.Handler, addr, token string) http.Handler {
	l := httpguard.For(addr)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !l.HostOK(r) {
			fail(w, http.StatusMisdirectedRequest, fmt.Errorf("the Host %q is not this API's address %s", r.Host, addr))
			return
		}
		if o := r.Header.Get("Origin"); o != "" {
			u, err := url.Parse(o)
			if err != nil || u.Scheme != "http" || !l.HostOK(&http.Request{Host: u.Host}) {
				fail(w, http.StatusForbidden, fmt.Errorf("cross-origin request from %q refused", o))
				return
			}
		}
		if fs := r.Header.Get("Sec-Fetch-Site"); fs != "" && fs != "same-origin" && fs != "none" {
			fail(w, http.StatusForbidden, fmt.Errorf("cross-site request (Sec-Fetch-Site %s) refused", fs))
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if err != nil || mt != "application/json" {
				fail(w, http.StatusUnsupportedMediaType, errors.New("the Content-Type must be application/json"))
				return
			}
		}
		if !httpguard.TokenOK(r, token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="blockwire"`)
			fail(w, http.StatusUnauthorized, errors.New("missing or wrong token: send Authorization: Bearer followed by the content of serve's --admin-http-token file"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// errPath marks a file path outside the configured directories.
var errPath = errors.New("admin: path refused")

// checkPath admits p only when it is absolute and lies, after resolving
// every symbolic link of what exists of it, inside one of dirs.
func checkPath(dirs []string, p string) error {
	if len(dirs) == 0 {
		return fmt.Errorf("%w: %s: the configuration names no directory the API may use (admin_dirs)", errPath, p)
	}
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%w: %s is not an absolute path", errPath, p)
	}
	real, err := resolve(filepath.Clean(p))
	if err != nil {
		return fmt.Errorf("%w: %s: %v", errPath, p, err)
	}
	for _, d := range dirs {
		rd, err := filepath.EvalSymlinks(d)
		if err != nil {
			continue
		}
		if rel, err := filepath.Rel(rd, real); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && rel != "." {
			return nil
		}
	}
	return fmt.Errorf("%w: %s is outside the directories the API may use (%s)", errPath, p, strings.Join(dirs, ", "))
}

// resolve follows symbolic links through the longest existing prefix of p
// and appends the rest.
func resolve(p string) (string, error) {
	rest := ""
	for {
		if _, err := os.Lstat(p); err == nil {
			r, err := filepath.EvalSymlinks(p)
			if err != nil {
				return "", err
			}
			return filepath.Join(r, rest), nil
		}
		parent := filepath.Dir(p)
		if parent == p {
			return filepath.Join(p, rest), nil
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
}
