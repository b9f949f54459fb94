package file

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blockwire/blockwire/internal/uring"
)

// engines are the ways a File may run here: both engines, buffered and
// direct (direct where the test directory's filesystem takes O_DIRECT).
func engines() []Options {
	var out []Options
	for _, e := range []string{EnginePread, EngineURing, EngineAuto} {
		out = append(out, Options{Engine: e}, Options{Engine: e, Direct: true, BlockSize: 4096})
	}
	// A ring that polls (serve --poll): the caller alone on it polls.
	out = append(out, Options{Engine: EngineURing, Direct: true, BlockSize: 4096, Poll: time.Millisecond})
	return out
}

func name(o Options) string {
	n := o.Engine
	if o.Direct {
		n += "+direct"
	}
	if o.Poll > 0 {
		n += "+poll"
	}
	return n
}

// tempDir is t.TempDir, or with tmpfs a directory in /dev/shm.
func tempDir(t *testing.T, tmpfs bool) string {
	if !tmpfs {
		return t.TempDir()
	}
	d, err := os.MkdirTemp("/dev/shm", "blockwire-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// TestEnginesAgree runs random reads, writes and durable writes from
// many goroutines on each engine and checks every byte against a model;
// with direct I/O, a third of the buffers start off the memory alignment
// and go through the bounce buffers.
func TestEnginesAgree(t *testing.T) {
	for _, tmpfs := range []bool{false, true} {
		for _, o := range engines() {
			if tmpfs && o.Direct {
				continue // tmpfs takes O_DIRECT only on newer kernels
			}
			t.Run(fmt.Sprintf("%s/tmpfs=%v", name(o), tmpfs), func(t *testing.T) {
				const blk, blocks = 4096, 512
				path := filepath.Join(tempDir(t, tmpfs), "d.img")
				o.Size = blk * blocks
				b, err := Open(path, o)
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				if e, why := b.Engine(); (o.Engine != EngineAuto && e != o.Engine) || b.Direct() != o.Direct || b.Poll() != o.Poll {
					t.Fatalf("engine %q (%s), direct %v, poll %v; want %q, direct %v, poll %v", e, why, b.Direct(), b.Poll(), o.Engine, o.Direct, o.Poll)
				}
				model := make([]byte, blk*blocks)
				var mu [blocks]sync.Mutex // one writer or reader of a block at a time
				var wg sync.WaitGroup
				errs := make(chan error, 16)
				for g := range 16 {
					wg.Go(func() {
						rng := rand.New(rand.NewPCG(uint64(g), 7))
						raw := make([]byte, 8*blk+1)
						for range 300 {
							n := 1 + rng.IntN(8)
							lba := rng.IntN(blocks - n + 1)
							p := raw[:n*blk]
							if rng.IntN(3) == 0 {
								p = raw[1 : 1+n*blk] // off the alignment in memory
							}
							for i := lba; i < lba+n; i++ {
								mu[i].Lock()
							}
							off := int64(lba) * blk
							var err error
							switch rng.IntN(3) {
							case 0:
								if _, err = b.ReadAt(p, off); err == nil && !bytes.Equal(p, model[off:off+int64(len(p))]) {
									err = fmt.Errorf("read of %d blocks at %d differs from what was written", n, lba)
								}
							case 1, 2:
								for i := range p {
									p[i] = byte(rng.Uint32())
								}
								if rng.IntN(2) == 0 {
									_, err = b.WriteAt(p, off)
								} else {
									_, err = b.WriteAtDurable(p, off)
								}
								copy(model[off:], p)
							}
							for i := lba; i < lba+n; i++ {
								mu[i].Unlock()
							}
							if err != nil {
								errs <- err // one per goroutine at most
								return
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				if err := b.Flush(); err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(path)
				if err != nil || !bytes.Equal(got, model) {
					t.Fatalf("the file differs from the model after the run (%v)", err)
				}
			})
		}
	}
}

// TestFallback: where the kernel refuses io_uring, auto falls back to
// pread and says why; io_uring asked for explicitly fails Open.
func TestFallback(t *testing.T) {
	refuse := func(uint32, time.Duration) (*uring.Ring, error) {
		return nil, fmt.Errorf("uring: io_uring_setup: %w", syscall.EPERM)
	}
	path := filepath.Join(t.TempDir(), "f.img")
	b, err := Open(path, Options{Size: 1 << 20, newRing: refuse})
	if err != nil {
		t.Fatal(err)
	}
	e, why := b.Engine()
	if e != EnginePread || !strings.Contains(why, "refuses io_uring: uring: io_uring_setup: operation not permitted") || !errors.Is(b.RingRefused(), syscall.EPERM) {
		t.Fatalf("engine %q, why %q; want pread with the kernel's reason", e, why)
	}
	if _, err := b.WriteAtDurable([]byte("fallback"), 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8)
	if _, err := b.ReadAt(got, 4096); err != nil || string(got) != "fallback" {
		t.Fatalf("read %q, %v", got, err)
	}
	b.Close()
	if _, err := Open(path, Options{Engine: EngineURing, newRing: refuse}); err == nil || !strings.Contains(err.Error(), "io_uring") {
		t.Fatalf("io_uring demanded on a kernel that refuses it: %v", err)
	}
	if _, err := Open(path, Options{Engine: "aio"}); err == nil {
		t.Fatal("an unknown engine was taken")
	}
}

// TestAutoChoice: auto takes the ring for direct I/O and for buffered
// reads where the filesystem has RWF_NOWAIT reads (the test directory's,
// ext4 here), pwrite for buffered writes, and plain calls on tmpfs, where
// the ring would hand every I/O to a kernel worker.
func TestAutoChoice(t *testing.T) {
	dir := t.TempDir()
	if !nowaitDir(t, dir) {
		t.Fatalf("%s has no RWF_NOWAIT reads; this test needs a disk filesystem there (ext4, xfs)", dir)
	}
	shm, err := os.MkdirTemp("/dev/shm", "blockwire-test")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(shm)
	for _, c := range []struct {
		dir    string
		direct bool
		want   string
		why    string
	}{
		{dir, false, "io_uring reads, pwrite writes", "kernel worker"},
		{dir, true, EngineURing, ""},
		{shm, false, EnginePread, "RWF_NOWAIT"},
	} {
		b, err := Open(filepath.Join(c.dir, fmt.Sprintf("auto%v.img", c.direct)), Options{Size: 1 << 20, Direct: c.direct, BlockSize: 4096})
		if err != nil {
			t.Fatal(err)
		}
		e, why := b.Engine()
		b.Close()
		if e != c.want || !strings.Contains(why, c.why) {
			t.Errorf("auto in %s, direct %v: %q (%s); want %q (…%s…)", c.dir, c.direct, e, why, c.want, c.why)
		}
	}
}

func nowaitDir(t *testing.T, dir string) bool {
	f, err := os.Create(filepath.Join(dir, "probe"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write([]byte{1})
	return nowaitReads(int(f.Fd()))
}

// TestDirectAlignment: a block size off the file's direct-I/O alignment
// is refused at Open with the size to use.
func TestDirectAlignment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.img")
	b, err := Open(path, Options{Size: 1 << 20, Direct: true, BlockSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	_, err = Open(path, Options{Direct: true, BlockSize: 256})
	if err == nil || !strings.Contains(err.Error(), "block_size") {
		t.Fatalf("block size 256 with direct I/O: %v", err)
	}
	// A file this Open would have created is not left behind.
	fresh := filepath.Join(t.TempDir(), "fresh.img")
	if _, err := Open(fresh, Options{Size: 1 << 20, Direct: true, BlockSize: 256}); err == nil {
		t.Fatal("block size 256 with direct I/O on a new file")
	}
	if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused Open left its new file behind: %v", err)
	}
}

// TestSubBlockIO: the SCSI core hands a backend less than a block when an
// initiator's expected transfer length falls short of the command's
// (libiscsi's residual tests do: 200 bytes of a 512-byte block). Every
// engine takes such reads and writes at any offset, direct I/O too
// (through an aligned bounce buffer; a write is a read-modify-write of
// the blocks it touches), and leaves the bytes around them alone.
func TestSubBlockIO(t *testing.T) {
	for _, o := range engines() {
		t.Run(name(o), func(t *testing.T) {
			o.Size = 1 << 20
			b, err := Open(filepath.Join(t.TempDir(), "s.img"), o)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			model := make([]byte, 1<<20)
			for i := range model {
				model[i] = byte(i * 7)
			}
			if _, err := b.WriteAt(model, 0); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct{ off, n int }{{0, 200}, {100, 200}, {4000, 200}, {4090, 8200}, {1<<20 - 3, 3}, {8192, 4096}} {
				p := bytes.Repeat([]byte{byte(c.off), 0xa5}, c.n/2+1)[:c.n]
				if _, err := b.WriteAt(p, int64(c.off)); err != nil {
					t.Fatalf("write [%d,+%d): %v", c.off, c.n, err)
				}
				copy(model[c.off:], p)
				if c.off+c.n == 1<<20 {
					if _, err := b.WriteAtDurable(p, int64(c.off)); err != nil {
						t.Fatalf("durable write [%d,+%d): %v", c.off, c.n, err)
					}
				}
				got := make([]byte, c.n+2)[1 : c.n+1] // off the memory alignment too
				if _, err := b.ReadAt(got, int64(c.off)); err != nil {
					t.Fatalf("read [%d,+%d): %v", c.off, c.n, err)
				}
				if !bytes.Equal(got, p) {
					t.Fatalf("read [%d,+%d) back wrong", c.off, c.n)
				}
			}
			all := make([]byte, 1<<20)
			if _, err := b.ReadAt(all, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(all, model) {
				t.Fatal("bytes around the sub-block writes changed")
			}
		})
	}
}

// TestDurableWriteSurvivesSIGKILL: a child process writes blocks with
// WriteAtDurable and reports each one as it returns; the test kills it
// with SIGKILL mid-stream, and every block reported must be in the file
// — on each engine, buffered and direct.
func TestDurableWriteSurvivesSIGKILL(t *testing.T) {
	if os.Getenv("BLOCKWIRE_FILE_CHILD") != "" {
		durableChild()
		return
	}
	for _, o := range engines() {
		t.Run(name(o), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "k.img")
			cmd := exec.Command(os.Args[0], "-test.run=^TestDurableWriteSurvivesSIGKILL$")
			cmd.Env = append(os.Environ(), "BLOCKWIRE_FILE_CHILD="+path, "BLOCKWIRE_FILE_ENGINE="+o.Engine, "BLOCKWIRE_FILE_DIRECT="+strconv.FormatBool(o.Direct), "BLOCKWIRE_FILE_POLL="+o.Poll.String())
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(out)
			acked := map[uint64]uint64{} // block → sequence number
			deadline := time.Now().Add(30 * time.Second)
			for len(acked) < 3000 && time.Now().Before(deadline) && sc.Scan() {
				var blk, seq uint64
				if _, err := fmt.Sscanf(sc.Text(), "ack %d %d", &blk, &seq); err != nil {
					t.Fatalf("child said %q", sc.Text())
				}
				acked[blk] = seq
			}
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			if len(acked) < 100 {
				t.Fatalf("only %d acknowledged writes before the kill", len(acked))
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for blk, seq := range acked {
				got := binary.LittleEndian.Uint64(data[blk*4096:])
				if got < seq {
					t.Fatalf("block %d: acknowledged write %d, the file holds %d", blk, seq, got)
				}
			}
		})
	}
}

// durableChild writes sequence numbers into blocks until killed.
func durableChild() {
	path := os.Getenv("BLOCKWIRE_FILE_CHILD")
	poll, err := time.ParseDuration(os.Getenv("BLOCKWIRE_FILE_POLL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	b, err := Open(path, Options{Size: 16 << 20, Engine: os.Getenv("BLOCKWIRE_FILE_ENGINE"),
		Direct: os.Getenv("BLOCKWIRE_FILE_DIRECT") == "true", BlockSize: 4096, Poll: poll})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	w := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			buf := make([]byte, 4096)
			for seq := uint64(1); ; seq++ {
				blk := uint64(g) + 8*(seq%512)
				binary.LittleEndian.PutUint64(buf, seq)
				if _, err := b.WriteAtDurable(buf, int64(blk)*4096); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				mu.Lock()
				fmt.Fprintf(w, "ack %d %d\n", blk, seq)
				w.Flush()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// TestNoAllocationsPerIO: reads, writes and durable writes of aligned
// buffers allocate nothing, on either engine.
func TestNoAllocationsPerIO(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race; .ci/run runs this test without it")
	}
	for _, o := range engines() {
		t.Run(name(o), func(t *testing.T) {
			o.Size = 1 << 20
			b, err := Open(filepath.Join(t.TempDir(), "n.img"), o)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			buf := make([]byte, 128<<10)
			if a := testing.AllocsPerRun(100, func() {
				b.WriteAt(buf[:4096], 0)
				b.ReadAt(buf[:4096], 8192)
				b.WriteAtDurable(buf, 64<<10)
				b.ReadAt(buf, 0)
			}); a > 0 {
				t.Errorf("%.1f allocations per round", a)
			}
		})
	}
}

func TestErrorsAreClear(t *testing.T) {
	b, err := Open(filepath.Join(t.TempDir(), "e.img"), Options{Size: 8192})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.ReadAt(make([]byte, 4096), 8192); err == nil {
		t.Error("a read past the end succeeded")
	}
	if _, err := b.WriteAtDurable(make([]byte, 4096), 6144); err == nil {
		t.Error("a durable write past the end succeeded")
	}
	b.Close()
	if _, err := b.ReadAt(make([]byte, 512), 0); !errors.Is(err, uring.ErrClosed) {
		t.Errorf("a read after Close: %v", err)
	}
}

// BenchmarkQD32 runs 4 KiB random I/O from 32 goroutines on each path:
// the backend alone, without a network in front (BLOCKWIRE_BENCH_FILE
// names a file or device to use, default a 256 MiB file in the test
// directory).
func BenchmarkQD32(b *testing.B) {
	benchPaths(b, func(b *testing.B, io func(rng *rand.Rand, buf []byte)) {
		b.SetParallelism(16) // × GOMAXPROCS 2 = 32 in flight
		var seed atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			rng, buf := rand.New(rand.NewPCG(seed.Add(1), 3)), make([]byte, 4096)
			for pb.Next() {
				io(rng, buf)
			}
		})
	})
}

// BenchmarkQD1 is one 4 KiB random read or write at a time: the latency
// of each path.
func BenchmarkQD1(b *testing.B) {
	benchPaths(b, func(b *testing.B, io func(rng *rand.Rand, buf []byte)) {
		rng, buf := rand.New(rand.NewPCG(1, 3)), make([]byte, 4096)
		for b.Loop() {
			io(rng, buf)
		}
	})
}

// benchPaths runs run on each path, reading and writing, with io doing
// one 4 KiB random I/O.
func benchPaths(b *testing.B, run func(b *testing.B, io func(rng *rand.Rand, buf []byte))) {
	path := os.Getenv("BLOCKWIRE_BENCH_FILE")
	if path == "" {
		path = filepath.Join(b.TempDir(), "bench.img")
		if err := os.WriteFile(path, make([]byte, 256<<20), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	for _, o := range engines() {
		for _, write := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/write=%v", name(o), write), func(b *testing.B) {
				o.BlockSize = 4096
				f, err := Open(path, o)
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				blocks := f.Size() / 4096
				b.SetBytes(4096)
				run(b, func(rng *rand.Rand, buf []byte) {
					off := rng.Int64N(blocks) * 4096
					if write {
						f.WriteAt(buf, off)
					} else {
						f.ReadAt(buf, off)
					}
				})
			})
		}
	}
}
