# lib-io.sh (sourced by scenarios, not a scenario): the checks several
# scenarios share.

# srp_disk HCA DEST ID LOG: the kernel's ib_srp (through srp-HCA) logs in
# to the SRP target port ID (id_ext and ioc_guid) at DEST; the disk
# appears, the I/O and ext4 checks run on it, the target's LOG shows the
# channel; the remote port is removed again. Returns 0 when all held.
srp_disk() {
  src=0
  echo "id_ext=$3,ioc_guid=$3,dest=$2,initiator_ext=0000000000000002" > /sys/class/infiniband_srp/srp-$1/add_target || src=1
  for i in $(seq 1 50); do DEV=$(ls /sys/class/scsi_host/*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
  if [ -n "$DEV" ] && [ -b /dev/$DEV ]; then
    say "SRP block device /dev/$DEV size $(cat /sys/block/$DEV/size) sectors"
    io_test || src=1
    grep -q 'srp: channel up' $4 || { say "no SRP channel in the target's log"; src=1; }
  else
    say "no SRP block device"; src=1
  fi
  dmesg | grep -iE 'srp|rxe|siw' | grep -v "speed is" | tail -8
  for p in /sys/class/srp_remote_ports/port-*; do [ -e $p/delete ] && echo 1 > $p/delete; done
  sleep 1
  return $src
}

# bench_copy LOG "QDS" TIME SIZE BIN [FLAGS]: our initiator BIN (with its
# namespace prefix, if any) with FLAGS runs the verifying benchmark on $U
# (random writes and reads at each queue depth in QDS), then copies 4 MiB
# in and out; its output goes to LOG, which must hold no warning. Returns
# 0 when all held.
bench_copy() {
  log=$1; qds=$2; t=$3; size=$4; bin=$5; flags=$6; brc=0
  for qd in $qds; do
    for rw in randwrite randread; do
      timeout 90 $bin bench $flags --verify --overwrite --rw $rw --qd $qd --time $t --size $size $U > /tmp/b.out 2>&1 || brc=1
      grep -E "IOPS=|verify|blockwire:" /tmp/b.out
      cat /tmp/b.out >> $log
      grep -q "verify: 0 mismatches" /tmp/b.out || { tail -5 /tmp/b.out; brc=1; }
    done
  done
  rm -f /tmp/src /tmp/back
  dd if=/dev/urandom of=/tmp/src bs=1M count=4 2>/dev/null
  timeout 120 $bin copy $flags /tmp/src $U 2>> $log || { say "copy in failed: $(grep -v 'level=INFO' $log | tail -2)"; brc=1; }
  timeout 120 $bin read $flags --force $U --length 4MiB --out /tmp/back 2>> $log || { say "copy out failed: $(grep -v 'level=INFO' $log | tail -2)"; brc=1; }
  cmp /tmp/src /tmp/back || brc=1
  if grep -E "level=(WARN|ERROR)" $log; then say "the initiator logged a warning"; brc=1; fi
  return $brc
}

# hostile_check LOG DEV ADDR IPORT SPORT ID: with a Linux session's disk
# on /dev/$DEV holding a pattern, /lab/bin/hostile connects to blockwire
# (pid $B, log LOG, run with --log-level debug) over RDMA device DEV as an
# initiator would — 6 times to the iSER portal ADDR:IPORT, 4 times to the
# SRP portal ADDR:SPORT (target port ID:ID) — and posts RDMA Writes and
# Reads under keys the target never advertised. Every one must be
# refused, blockwire must still run and have ended every one of those
# connections, and the session's pattern must read back, new I/O too.
# Returns 0 when all held.
hostile_check() {
  log=$1; hrc=0
  dd if=/dev/urandom of=/tmp/pat bs=64k count=32 2>/dev/null
  dd if=/tmp/pat of=/dev/$DEV bs=64k oflag=direct 2>/dev/null || hrc=1
  timeout 300 /lab/bin/hostile -device $2 -a $3:$4 -n 6 -seed 1 -hold 1s > /tmp/hostile.out 2>&1 || hrc=1
  timeout 300 /lab/bin/hostile -device $2 -a $3:$5 -n 4 -seed 2 -hold 1s -srp $6:$6 >> /tmp/hostile.out 2>&1 || hrc=1
  cat /tmp/hostile.out
  n=$(grep -c ': refused (' /tmp/hostile.out)
  [ "$n" = 10 ] && say "all 10 hostile RDMA operations refused" || { say "refused: $n of 10"; hrc=1; }
  kill -0 $B 2>/dev/null || { say "blockwire died"; grep -m1 -B2 -A30 -E "^(SIG|panic|fatal)" $log; return 1; }
  sleep 2
  i=$(grep -cE 'msg="connection ended" remote=iser:[^ ]+( err=.*)?$' $log)
  s=$(grep -c 'srp: channel down.*initiator=0x0badbad' $log)
  [ "$i" = 6 ] && [ "$s" = 4 ] && say "blockwire ended all 10 hostile connections" || { say "hostile connections ended: iSER $i of 6, SRP $s of 4"; hrc=1; }
  dd if=/dev/$DEV of=/tmp/rb bs=64k count=32 iflag=direct 2>/dev/null && cmp /tmp/pat /tmp/rb && say "the Linux session survived: its data reads back unchanged" || hrc=1
  dd if=/dev/urandom of=/tmp/pat bs=64k count=32 2>/dev/null
  dd if=/tmp/pat of=/dev/$DEV bs=64k oflag=direct 2>/dev/null && dd if=/dev/$DEV of=/tmp/rb bs=64k count=32 iflag=direct 2>/dev/null &&
    cmp /tmp/pat /tmp/rb && say "new I/O after the attacks: dd readback OK" || hrc=1
  return $hrc
}

# remove_under DEV ADDR LOG: the kernel RDMA device DEV goes away (rdma
# link delete) under the serving blockwire $B (its log LOG, its iSCSI/TCP
# portal on ADDR:3260): it must stay up, log the removal, go on serving
# iSCSI/TCP, and let the deletion complete while it runs. Returns 1 when a
# check failed, 2 when blockwire died or the deletion did not complete
# (blockwire then stopped: the scenario ends).
remove_under() {
  rdev=$1; raddr=$2; rlog=$3; rrc=0
  rdma link delete $rdev & D=$!
  sleep 3
  kill -0 $B 2>/dev/null || { say "blockwire died when $rdev went away"; grep -m1 -B2 -A30 -E "^(SIG|panic|fatal)" $rlog; return 2; }
  grep -q "RDMA device removed: the connection ends" $rlog && say "removal logged: $(grep -o 'msg="[^"]*RDMA device[^"]*"' $rlog | sort -u | tr '\n' ' ')" || { say "no log line for the removal"; rrc=1; }
  timeout 30 /lab/bin/blockwire-verbs inquiry iscsi://$raddr:3260/$IQN/0 > /tmp/inq.out 2>&1 && say "iSCSI/TCP still serves: $(head -1 /tmp/inq.out)" || { cat /tmp/inq.out; rrc=1; }
  # The process lets go of everything it held on the device, its
  # librdmacm contexts included.
  for i in $(seq 1 100); do kill -0 $D 2>/dev/null || break; sleep 0.2; done
  if kill -0 $D 2>/dev/null; then
    say "$rdev not deleted while blockwire runs; it holds: $(ls -l /proc/$B/fd | grep -oE '(infiniband|uverbs|rdma_cm|anon_inode)[^ ]*' | sort | uniq -c | tr '\n' ' ')"
    kill $B; wait $D; return 2
  fi
  say "$rdev deleted while blockwire runs"
  return $rrc
}

# logout_gone: logs every session out and waits for them to be gone, so
# that a device coming back finds none to log in again (iscsid would) and
# the next login finds only its own disk. Returns 1, saying so, if one
# stays.
logout_gone() {
  timeout 30 iscsiadm -m node -u >/dev/null 2>&1; iscsiadm -m node -o delete >/dev/null 2>&1
  for i in $(seq 1 50); do iscsiadm -m session >/dev/null 2>&1 || return 0; sleep 0.2; done
  say "a session stays after logout: $(iscsiadm -m session 2>&1 | head -2 | tr '\n' ' ')"; return 1
}

# scsi_debug_disk: loads scsi_debug (a 64 MiB RAM disk whose command delay
# can be raised) and sets SD to its block device. Returns 0 when it is there.
scsi_debug_disk() {
  modprobe sd_mod; modprobe scsi_debug dev_size_mb=64 max_queue=128 || { say "no scsi_debug"; return 1; }
  for i in $(seq 1 50); do SD=$(ls /sys/bus/pseudo/drivers/scsi_debug/adapter*/host*/target*/*/block 2>/dev/null | head -1); [ -n "$SD" ] && [ -b /dev/$SD ] && break; sleep 0.2; done
  [ -b /dev/$SD ] || { say "no scsi_debug disk"; return 1; }
  say "scsi_debug disk /dev/$SD"
}

# scsi_debug_gone: unloads scsi_debug once nothing holds its disk, so the
# next scenarios of the boot find only their own SCSI disks.
scsi_debug_gone() {
  echo 1 > /sys/bus/pseudo/drivers/scsi_debug/delay 2>/dev/null
  for i in $(seq 1 25); do rmmod scsi_debug 2>/dev/null && return 0; sleep 0.2; done
  say "scsi_debug stays loaded"; return 1
}

# stall_reads LOG: with open-iscsi logged in to blockwire (log LOG) whose
# LUN is the scsi_debug disk, and /dev/$DEV its disk with queue_depth 64,
# the storage stalls (every scsi_debug command takes 12 s: delay=3000
# jiffies at HZ=250) while 48 reads are outstanding: more than one
# connection's 32 commands on workers, so 16 of them wait for a worker and
# end after 24 s, within the SCSI layer's 30 s. open-iscsi pings a
# connection it has heard nothing from for 5 s (noop_out_interval) and
# drops it when the ping is not answered within 5 s more
# (noop_out_timeout): blockwire must go on reading the connection while
# commands wait. Returns 0 when every read returned the data written
# before, with no connection error in the kernel log and none in LOG.
stall_reads() {
  say "queue depth $(cat /sys/block/$DEV/device/queue_depth) on /dev/$DEV"
  dd if=/dev/urandom of=/tmp/pat bs=4k count=48 2>/dev/null
  dd if=/tmp/pat of=/dev/$DEV bs=4k oflag=direct 2>/dev/null
  mark=$(dmesg | wc -l)
  echo 3000 > /sys/bus/pseudo/drivers/scsi_debug/delay
  t0=$(date +%s)
  pids=; for i in $(seq 0 47); do dd if=/dev/$DEV of=/tmp/r$i bs=4k count=1 skip=$i iflag=direct 2>/dev/null & pids="$pids $!"; done
  bad=0; for j in $pids; do wait $j || bad=$((bad+1)); done
  t1=$(date +%s)
  echo 1 > /sys/bus/pseudo/drivers/scsi_debug/delay
  say "48 reads done in $((t1-t0)) s, $bad failed"
  ok=0; for i in $(seq 0 47); do dd if=/tmp/pat bs=4k count=1 skip=$i 2>/dev/null | cmp -s - /tmp/r$i && ok=$((ok+1)); done
  errs=$(dmesg | tail -n +$((mark+1)) | grep -ci "ping timeout\|conn error")
  dmesg | tail -n +$((mark+1)) | grep -i "iscsi\|iser\|connection" | tail -5
  say "$ok of 48 reads match; $errs connection errors in the kernel log"
  [ $bad = 0 ] && [ $ok = 48 ] && [ "$errs" = 0 ] && [ $((t1-t0)) -ge 20 ] || return 1
  ! grep -q "connection ended" $1 || { say "blockwire saw the connection end"; return 1; }
}
