package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/blockwire/blockwire/config"
)

// endpoint is one side of a copy: a local file or an iSCSI LUN.
type endpoint struct {
	name   string
	dev    device
	f      *os.File
	size   int64
	sparse bool // a regular file written from scratch: zeroes become holes
}

func (e *endpoint) ReadAt(p []byte, off int64) (int, error) {
	if e.dev != nil {
		return e.dev.ReadAt(p, off)
	}
	return e.f.ReadAt(p, off)
}

func (e *endpoint) WriteAt(p []byte, off int64) (int, error) {
	if e.dev != nil {
		return e.dev.WriteAt(p, off)
	}
	return e.f.WriteAt(p, off)
}

// writeSparse writes p at off; to a regular file it skips the 64 KiB
// pieces that are all zeroes, leaving holes (the file was sized first).
func (e *endpoint) writeSparse(p []byte, off int64) error {
	if e.dev != nil || !e.sparse {
		_, err := e.WriteAt(p, off)
		return err
	}
	const piece = 64 << 10
	for i := 0; i < len(p); i += piece {
		q := p[i:min(i+piece, len(p))]
		if allZero(q) {
			continue
		}
		if _, err := e.f.WriteAt(q, off+int64(i)); err != nil {
			return err
		}
	}
	return nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func (e *endpoint) close() error {
	if e.dev != nil {
		if err := e.dev.Flush(); err != nil {
			e.dev.Close()
			return err
		}
		return e.dev.Close()
	}
	if err := e.f.Sync(); err != nil {
		e.f.Close()
		return err
	}
	return e.f.Close()
}

func openEndpoint(ctx context.Context, name string, write bool, o clientOptions) (*endpoint, error) {
	if isURL(name) {
		d, err := openDevice(ctx, name, o)
		if err != nil {
			return nil, err
		}
		return &endpoint{name: name, dev: d, size: d.Size()}, nil
	}
	flag := os.O_RDONLY
	if write {
		flag = os.O_RDWR | os.O_CREATE
	}
	f, err := os.OpenFile(name, flag, 0o644)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &endpoint{name: name, f: f, size: st.Size(), sparse: write && st.Mode().IsRegular()}, nil
}

// copyVerb copies file to LUN, LUN to file or LUN to LUN, with a progress
// bar when standard error is a terminal.
func copyVerb(args []string, stdout, stderr io.Writer) int {
	fs, o, ts := clientFlags("copy", stderr)
	force := fs.Bool("force", false, "let DST replace an existing file that holds data")
	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil || len(pos) != 2 {
		fmt.Fprintln(stderr, "usage: blockwire copy [flags] SRC DST   (each a file or an iscsi://, iser:// or srp:// URL)")
		return exitUsage
	}
	finishOptions(o, *ts, stderr)
	if !isURL(pos[1]) && !*force {
		if err := refuseClobber(pos[1]); err != nil {
			fmt.Fprintln(stderr, "blockwire:", err)
			return exitUsage
		}
	}
	for _, p := range pos {
		if isURL(p) {
			if err := checkURL(p); err != nil {
				fmt.Fprintln(stderr, "blockwire:", err)
				return exitUsage
			}
		}
	}
	ctx, cancel := signalContext()
	defer cancel()
	src, err := openEndpoint(ctx, pos[0], false, *o)
	if err != nil {
		return fail(stderr, err)
	}
	defer func() {
		if src.dev != nil {
			src.dev.Close()
		} else {
			src.f.Close()
		}
	}()
	dst, err := openEndpoint(ctx, pos[1], true, *o)
	if err != nil {
		return fail(stderr, err)
	}
	n := src.size
	if dst.sparse {
		// A regular file becomes the image: exactly n bytes, holes where
		// the source reads zeroes (writeSparse skips them), as qemu-img
		// convert makes it.
		err := dst.f.Truncate(0)
		if err == nil {
			err = dst.f.Truncate(n)
		}
		if err != nil {
			dst.close()
			return fail(stderr, err)
		}
	}
	if dst.dev != nil && n > dst.size {
		fmt.Fprintf(stderr, "blockwire: %s (%d bytes) does not fit in %s (%d bytes)\n", src.name, n, dst.name, dst.size)
		dst.close()
		return exitUsage
	}
	chunk := int64(1 << 20)
	for _, e := range []*endpoint{src, dst} {
		if e.dev != nil && n%int64(e.dev.BlockSize()) != 0 {
			fmt.Fprintf(stderr, "blockwire: %d bytes is not a whole number of %d-byte blocks of %s\n", n, e.dev.BlockSize(), e.name)
			dst.close()
			return exitUsage
		}
	}
	var bar *progressbar.ProgressBar
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar = progressbar.DefaultBytes(n, "copying")
	}
	buf := make([]byte, chunk)
	for off := int64(0); off < n; off += chunk {
		if ctx.Err() != nil {
			dst.close()
			return fail(stderr, ctx.Err())
		}
		c := min(chunk, n-off)
		if _, err := src.ReadAt(buf[:c], off); err != nil && err != io.EOF {
			dst.close()
			return fail(stderr, err)
		}
		if err := dst.writeSparse(buf[:c], off); err != nil {
			dst.close()
			return fail(stderr, err)
		}
		if bar != nil {
			bar.Add64(c)
		}
	}
	if err := dst.close(); err != nil {
		return fail(stderr, err)
	}
	if bar != nil {
		bar.Finish()
	}
	fmt.Fprintf(stdout, "copied %d bytes from %s to %s\n", n, config.RedactURL(src.name), config.RedactURL(dst.name))
	return exitOK
}

// isURL tells an iSCSI, iSER or SRP URL from a file name.
func isURL(s string) bool {
	return strings.HasPrefix(s, "iscsi://") || strings.HasPrefix(s, "iser://") || strings.HasPrefix(s, "srp://") || isNVMeURL(s)
}

// refuseClobber refuses an output file that exists as a regular file
// holding data: replacing it needs --force. Devices (/dev/null, a disk
// the operator names) and empty files hold nothing a verb would lose.
func refuseClobber(name string) error {
	st, err := os.Stat(name)
	if err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
		return nil
	}
	return fmt.Errorf("%s exists and holds %d bytes: add --force to replace it", name, st.Size())
}
