// Command logreplay writes onto a disk image what a Linux dm-log-writes
// log (drivers/md/dm-log-writes.c) says was durable when a mark was set:
// the writes and discards logged before the mark, in order. Applied to a
// copy of the device as it was when logging began, it gives the device a
// power cut at the mark would have left — everything the page cache and
// the device's volatile cache held then gone. The guest lab's power-cut
// scenario runs it after each SIGKILL of the target (test/torture
// -power-cut).
//
//	logreplay -log log.img -mark powercut [-watch OFFSET:LENGTH] image.img
//
// It prints what it applied and how many writes the log holds after the
// mark (durable only later: what the cut lost) — with -watch, how many of
// them touched a byte range, such as the extent of the file a target
// serves — and exits 1 when the mark is not in the log.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	logPath := flag.String("log", "", "the log device or a copy of it")
	mark := flag.String("mark", "", "replay up to the mark of this name")
	watch := flag.String("watch", "", "OFFSET:LENGTH, bytes of the device: also count the lost writes that touch them (a file's extent)")
	flag.Parse()
	var w region
	if *watch != "" {
		if _, err := fmt.Sscanf(*watch, "%d:%d", &w.Off, &w.Len); err != nil || w.Off < 0 || w.Len <= 0 {
			fmt.Fprintf(os.Stderr, "logreplay: -watch %q: want OFFSET:LENGTH in bytes\n", *watch)
			os.Exit(2)
		}
	}
	if *logPath == "" || *mark == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: logreplay -log LOG -mark NAME IMAGE")
		os.Exit(2)
	}
	log, err := os.Open(*logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "logreplay:", err)
		os.Exit(1)
	}
	defer log.Close()
	img, err := os.OpenFile(flag.Arg(0), os.O_WRONLY, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "logreplay:", err)
		os.Exit(1)
	}
	var st replayStats
	fi, err := img.Stat()
	if err == nil {
		size := fi.Size()
		if fi.Mode()&os.ModeDevice != 0 {
			size, err = img.Seek(0, io.SeekEnd)
		}
		if err == nil {
			st, err = replay(log, img, size, *mark, w)
		}
	}
	if err == nil {
		err = img.Sync()
	}
	if cerr := img.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "logreplay:", err)
		os.Exit(1)
	}
	fmt.Printf("logreplay: %d writes, %d discards, %d flushes, %d FUA up to mark %q; %d writes after it lost, %d of them in the watched range\n",
		st.Writes, st.Discards, st.Flushes, st.FUA, *mark, st.Lost, st.LostIn)
}
