# verbs-rxe-srp-cycles: Linux's ib_srp logs in to blockwire's SRP port on
# the kernel's rxe, reads from the disk and has its remote port deleted,
# 40 times. Each login used to leave its queue pairs in RTS, with ~4 MiB
# registered, until blockwire exited (the channel ended on the peer's
# disconnect but never closed its queue pair); with 16 MiB of registered
# memory the 2nd login's failed set-up then crashed blockwire in
# rdma_reject on a freed id, and a command whose data could not be moved
# was never answered (the disk went offline). Now blockwire's queue pairs
# are back to their number before the cycles, every login gets its disk
# and every command an answer, and blockwire stops when asked.
. /lab/lib-io.sh
. /lab/lib-roce.sh
roce_lab || exit 1
modprobe ib_srp; modprobe sd_mod
ID=0011223344556677
/lab/bin/blockwire-verbs serve --listen 127.0.0.1:3268 --iser=false --iqn $IQN --size 16MiB --srp-roce-listen $LADDR:5555 \
  --rdma-device rxe0 --srp-id-ext $ID --rdma-memory 64MiB > /tmp/bsc.log 2>&1 &
B=$!
sleep 2
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bsc.log; exit 1; }
qps() { rdma res show qp 2>/dev/null | grep -c "comm blockwire-verbs"; }
base=$(qps)
say "blockwire's queue pairs before: $base ($(rdma res show qp 2>/dev/null | wc -l) in all)"
rc=0
n=0
for i in $(seq 1 40); do
  # ib_srp refuses a target it is still removing: try again a while.
  ok=0
  for j in $(seq 1 50); do
    echo "id_ext=$ID,ioc_guid=$ID,dest=$LADDR:5555,initiator_ext=0000000000000002" > /sys/class/infiniband_srp/srp-rxe0-1/add_target 2>/dev/null && { ok=1; break; }
    sleep 0.2
  done
  [ $ok = 1 ] || { say "login $i: add_target failed for 10 s"; dmesg | grep -i srp | tail -5; rc=1; break; }
  DEV=
  for j in $(seq 1 50); do DEV=$(ls /sys/class/scsi_host/*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.1; done
  if [ -z "$DEV" ] || ! timeout 20 dd if=/dev/$DEV of=/dev/null bs=64k count=16 iflag=direct 2>/dev/null; then
    say "login $i: no disk to read (/dev/$DEV)"; rc=1
  fi
  for p in /sys/class/srp_remote_ports/port-*; do [ -e $p/delete ] && echo 1 > $p/delete; done
  for j in $(seq 1 100); do ls /sys/class/srp_remote_ports/ 2>/dev/null | grep -q port- || ls /sys/class/scsi_host/*/device/target* >/dev/null 2>&1 || break; sleep 0.1; done
  kill -0 $B 2>/dev/null || { say "blockwire died at login $i"; rc=1; break; }
  n=$i
done
sleep 3
after=$(qps)
say "$n logins and removals: blockwire's queue pairs $base before, $after after; channels up $(grep -c 'srp: channel up' /tmp/bsc.log)"
[ "$after" -le "$base" ] || { say "queue pairs left behind"; rdma res show qp | grep "pid $B " | head -5; rc=1; }
kill -0 $B 2>/dev/null || rc=1
dmesg | grep -q "SRP abort called" && { say "a command went unanswered (ib_srp aborted it)"; rc=1; }
[ $rc = 0 ] || grep -E "level=(WARN|ERROR)|srp: (login|accept)|reject" /tmp/bsc.log | tail -25
kill $B
for j in $(seq 1 150); do kill -0 $B 2>/dev/null || break; sleep 0.1; done
if kill -0 $B 2>/dev/null; then
  say "blockwire did not stop within 15 s of SIGTERM"; rc=1
  kill -QUIT $B; sleep 2; grep -B2 -A14 "^goroutine .*\[\(semacquire\|sync\|chan\|select\|syscall\)" /tmp/bsc.log | grep -vE "^\s*$" | head -150
else
  wait $B || { say "blockwire did not stop cleanly"; rc=1; }
fi
grep -E "^(SIG|panic|fatal)" -A10 /tmp/bsc.log && rc=1
exit $rc
