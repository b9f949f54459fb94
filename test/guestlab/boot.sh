#!/bin/sh
# usage: boot.sh OUTDIR tests [extra initrd cpio]; serial console on stdout; guest powers off by itself
L=$1; T=$2; I=$L/initrd.img
if [ -n "${3:-}" ]; then cat $L/initrd.img "$3" > $L/initrd-combined.img; I=$L/initrd-combined.img; fi
exec timeout 600 qemu-system-x86_64 -machine q35,accel=tcg -cpu max -m 2048 -smp 2 -nographic -no-reboot \
  -nic none -kernel $L/vmlinuz -initrd $I \
  -append "console=ttyS0 quiet loglevel=5 panic=-1 lab.tests=$T"
