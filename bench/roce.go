package main

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"time"
)

// roceBench compares iSER over blockwire's software RoCEv2 device with
// iSCSI/TCP on the same target and LUN (the goal is
// RoCE at 0.8x TCP or better at 128 KiB, QD 8, both ways), rotating as
// every comparison does; the table also goes into -out as roce.json and
// roce.svg (with -poll, the target polling: roce-poll.json and .svg).
// Both ends run on this host over loopback (127.0.0.2 the target's RoCE
// address, 127.0.0.1 the initiator's).
func roceBench(bin string) {
	dur := runTime()
	_, tcpPort, _ := net.SplitHostPort(freePort())
	udp := freeUDPPort()
	args := []string{"--size", "1GiB", "--roce-listen", "127.0.0.2:" + tcpPort, "--roce-udp-port", udp}
	title, name := "iSER over the software RoCEv2 device vs iSCSI/TCP, one target, loopback", "roce"
	if *poll > 0 {
		// The target's receivers poll, on both fabrics; the initiator's
		// do not.
		args = append(args, "--poll", poll.String())
		title += ", the target polling " + poll.String()
		name = "roce-poll"
	}
	bw, stop := serve(nil, bin, "blockwire", args...)
	defer stop()
	tcp := target{name: "tcp", url: bw.url}
	roce := target{name: "roce", url: "iser://127.0.0.2:" + tcpPort + "/iqn.2026-11.org.blockwire:default/0", args: []string{"--roce", "127.0.0.1:" + udp}}
	ws := []workload{
		{"4k randread QD1", "IOPS", true, bwBench(bin, dur, "randread", "4k", "1", "IOPS")},
		{"4k randread QD32", "IOPS", true, bwBench(bin, dur, "randread", "4k", "32", "IOPS")},
		{"4k randwrite QD32", "IOPS", true, bwBench(bin, dur, "randwrite", "4k", "32", "IOPS")},
		{"128k read QD8", "MB/s", true, bwBench(bin, dur, "read", "128k", "8", "MB/s")},
		{"128k write QD8", "MB/s", true, bwBench(bin, dur, "write", "128k", "8", "MB/s")},
	}
	results := roundsN(ws, tcp, roce)
	host, _ := os.Hostname()
	fmt.Printf("\nblockwire bench, %s, %s, %s, %d cores, %d rounds (median [min-max])\n\n",
		title, time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU(), *rounds)
	fmt.Println("| workload | unit | iSCSI/TCP | iSER/RoCEv2 | RoCE/TCP |")
	fmt.Println("|---|---|---|---|---|")
	for _, w := range ws {
		a, b := results[w.name]["tcp"], results[w.name]["roce"]
		ratio := "n/a"
		if len(a) > 0 && len(b) > 0 && median(a) > 0 {
			ratio = fmt.Sprintf("%.2fx", median(b)/median(a))
		}
		fmt.Printf("| %s | %s | %s | %s | %s |\n", w.name, w.unit, stat(a), stat(b), ratio)
	}
	fmt.Printf("\nratio above 1: RoCE faster than TCP (the goal: 0.80x or better at 128 KiB QD 8, both ways)\n")
	writeComparison(name, title, ws, results, []string{"tcp", "roce"})
}

// freeUDPPort is a UDP port nobody uses on 127.0.0.1 and 127.0.0.2.
func freeUDPPort() string {
	for {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		p := c.LocalAddr().(*net.UDPAddr).Port
		c.Close()
		if c2, err := net.ListenPacket("udp4", "127.0.0.2:"+strconv.Itoa(p)); err == nil {
			c2.Close()
			return strconv.Itoa(p)
		}
	}
}
