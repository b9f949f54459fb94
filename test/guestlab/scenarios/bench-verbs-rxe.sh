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
mbps() { sed -n 's/.* copied, \([0-9.]*\) s, .*/\1/p' | tail -1; } # seconds
run() { # prints: r4k1 w4k1 r4k4 w4k4 r1m w1m (IOPS, IOPS, IOPS, IOPS, MB/s, MB/s)
  d=/dev/$DEV; n=4000
  t=$(dd if=$d of=/dev/null bs=4k count=$n iflag=direct 2>&1 | mbps); r1=$(echo "$n $t" | awk '{printf "%d", $1/$2}')
  t=$(dd if=/dev/zero of=$d bs=4k count=$n oflag=direct 2>&1 | mbps); w1=$(echo "$n $t" | awk '{printf "%d", $1/$2}')
  s=$(date +%s.%N); for k in 0 1 2 3; do dd if=$d of=/dev/null bs=4k count=$n skip=$((k*4000)) iflag=direct 2>/dev/null & done; wait
  r4=$(echo "$s $(date +%s.%N) $n" | awk '{printf "%d", 4*$3/($2-$1)}')
  s=$(date +%s.%N); for k in 0 1 2 3; do dd if=/dev/zero of=$d bs=4k count=$n seek=$((k*4000)) oflag=direct 2>/dev/null & done; wait
  w4=$(echo "$s $(date +%s.%N) $n" | awk '{printf "%d", 4*$3/($2-$1)}')
  t=$(dd if=$d of=/dev/null bs=1M count=48 iflag=direct 2>&1 | mbps); rm=$(echo "$t" | awk '{printf "%.1f", 48*1.048576/$1}')
  t=$(dd if=/dev/zero of=$d bs=1M count=48 oflag=direct 2>&1 | mbps); wm=$(echo "$t" | awk '{printf "%.1f", 48*1.048576/$1}')
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
  l=$(cut -d' ' -f$i /tmp/res.lio | med); b=$(cut -d' ' -f$i /tmp/res.bw | med)
  say "BENCH | $f | $l | $b | $(echo "$b $l" | awk '{printf "%.2f", $1/$2}')× |"
  i=$((i+1))
done
exit 0
