# bench-verbs-rxe (a benchmark, not a test: make guestlab-bench): the same
# Linux initiator (open-iscsi with ib_iser) against LIO's isert and against
# blockwire's verbs build, both on the kernel's rdma_rxe (rxe0 on va) in one
# guest, both serving a 64 MiB RAM LUN; rounds alternate between them.
# dd with O_DIRECT: 4 KiB reads and writes at QD 1 and QD 4 (four dd
# processes on separate ranges), 1 MiB at QD 1. Prints each figure and the
# blockwire / LIO ratio of the medians. Conditions: QEMU TCG (no KVM), 2
# vCPUs shared by target and initiator, software RoCE (rxe) in the kernel.
. /lab/lib-roce.sh
roce_lab || exit 1
modprobe ib_iser; modprobe ib_isert
lio_target 3261 $LADDR >/dev/null || exit 1
echo 1 > $CFG/iscsi/$IQN/tpgt_1/np/$LADDR:3261/iser || exit 1
BIQN=iqn.2026-11.org.blockwire:bench
/lab/bin/blockwire-verbs serve --listen 127.0.0.1:3262 --iser=false --roce-listen $LADDR:3260 --rdma-device rxe0 --iqn $BIQN --size 64MiB > /tmp/bb.log 2>&1 &
B=$!
sleep 2
iscsid_up || exit 1
login() { # $1 iqn $2 port
  iscsiadm -m node -o new -T $1 -p $LADDR:$2 -I iser >/dev/null && iscsiadm -m node -T $1 -p $LADDR:$2 -I iser --login >/dev/null || return 1
  for i in $(seq 1 50); do DEV=$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && return 0; sleep 0.2; done
  return 1
}
now() { cut -d' ' -f1 /proc/uptime; } # seconds, to the hundredth (busybox date has no %N)
# timed N PROCS CMD...: runs CMD in PROCS copies (arg $k is the copy's
# index), prints operations per second for N operations each.
timed() {
  n=$1; p=$2; shift 2
  s=$(now); k=0
  while [ $k -lt $p ]; do "$@" $k 2>/dev/null & k=$((k+1)); done; wait
  echo "$s $(now) $n $p" | awk '{d=$2-$1; if (d<=0) d=0.01; printf "%d", $3*$4/d}'
}
rd4() { dd if=/dev/$DEV of=/dev/null bs=4k count=2000 skip=$(($1*2000)) iflag=direct; }
wr4() { dd if=/dev/zero of=/dev/$DEV bs=4k count=2000 seek=$(($1*2000)) oflag=direct; }
rd1m() { dd if=/dev/$DEV of=/dev/null bs=1M count=48 iflag=direct; }
wr1m() { dd if=/dev/zero of=/dev/$DEV bs=1M count=48 oflag=direct; }
run() { # prints: r4k1 w4k1 r4k4 w4k4 r1m w1m (IOPS x4, then MB/s x2)
  r1=$(timed 2000 1 rd4); w1=$(timed 2000 1 wr4)
  r4=$(timed 2000 4 rd4); w4=$(timed 2000 4 wr4)
  rm=$(timed 48 1 rd1m | awk '{printf "%.1f", $1*1.048576}'); wm=$(timed 48 1 wr1m | awk '{printf "%.1f", $1*1.048576}')
  echo "$r1 $w1 $r4 $w4 $rm $wm"
}
rm -f /tmp/res.lio /tmp/res.bw
for round in 1 2 3; do
  for who in lio bw; do
    if [ $who = lio ]; then login $IQN 3261 || { say "login to LIO failed"; exit 1; }
    else login $BIQN 3260 || { say "login to blockwire failed"; exit 1; }; fi
    r=$(run); echo "$r" >> /tmp/res.$who
    say "round $round $who: $r"
    logout_all; sleep 1
  done
done
kill $B; wait $B
med() { sort -n | sed -n 2p; } # the median of three
say "BENCH conditions: QEMU TCG, 2 vCPUs, kernel rdma_rxe on a veth, open-iscsi + ib_iser, dd O_DIRECT, 64 MiB RAM LUN, 3 alternating rounds, medians"
say "BENCH | figure | LIO isert | blockwire (verbs) | blockwire / LIO |"
i=1
for f in "4k read QD1 IOPS" "4k write QD1 IOPS" "4k read QD4 IOPS" "4k write QD4 IOPS" "1M read QD1 MB/s" "1M write QD1 MB/s"; do
  l=$(awk -v f=$i '{print $f}' /tmp/res.lio | med); b=$(awk -v f=$i '{print $f}' /tmp/res.bw | med)
  say "BENCH | $f | $l | $b | $(echo "$b $l" | awk '{printf "%.2f", $1/$2}')× |"
  i=$((i+1))
done
exit 0
