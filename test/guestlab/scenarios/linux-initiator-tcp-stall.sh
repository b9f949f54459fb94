# linux-initiator-tcp-stall: the storage under blockwire stalls (a scsi_debug
# disk whose every command takes 12 s: delay=3000 jiffies at HZ=250) while
# open-iscsi has 48 reads outstanding on the LUN (queue_depth 64): more than
# one connection's 32 commands on workers, so 16 of them wait for a worker
# and end after 24 s, within the SCSI layer's 30 s. open-iscsi pings a
# connection it has heard nothing from for 5 s (noop_out_interval) and drops
# it when the ping is not answered within 5 s more (noop_out_timeout).
# blockwire keeps reading the connection while commands wait, so the pings
# are answered: no connection error in the kernel log, no reconnection, and
# every read returns the data written before. (When the receiver stopped
# reading instead, the connection was dropped every 12 s, the reads were
# sent again into the same stall, and after 111 s they failed with
# DID_TRANSPORT_DISRUPTED.)
modprobe sd_mod; modprobe scsi_debug dev_size_mb=64 max_queue=128 || { say "no scsi_debug"; exit 1; }
for i in $(seq 1 50); do SD=$(ls /sys/bus/pseudo/drivers/scsi_debug/adapter*/host*/target*/*/block 2>/dev/null | head -1); [ -n "$SD" ] && [ -b /dev/$SD ] && break; sleep 0.2; done
[ -b /dev/$SD ] || { say "no scsi_debug disk"; exit 1; }
say "scsi_debug disk /dev/$SD"
/lab/bin/blockwire serve --listen 127.0.0.1:3260 --iqn $IQN --file /dev/$SD --direct --iser=false > /tmp/bw.log 2>&1 &
BW=$!
sleep 1
rc=1
if iscsid_up && iscsiadm -m discovery -t st -p 127.0.0.1:3260; then
  iscsiadm -m node -T $IQN -p 127.0.0.1:3260 -o update -n node.session.queue_depth -v 64
  if iscsiadm -m node -T $IQN -p 127.0.0.1:3260 --login; then
    for i in $(seq 1 50); do DEV=$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
    say "queue depth $(cat /sys/block/$DEV/device/queue_depth) on /dev/$DEV"
    dd if=/dev/urandom of=/tmp/pat bs=4k count=48 2>/dev/null
    dd if=/tmp/pat of=/dev/$DEV bs=4k oflag=direct 2>/dev/null
    mark=$(dmesg | wc -l)
    echo 3000 > /sys/bus/pseudo/drivers/scsi_debug/delay
    t0=$(date +%s)
    pids=; for i in $(seq 0 47); do dd if=/dev/$DEV of=/tmp/r$i bs=4k count=1 skip=$i iflag=direct 2>/dev/null & pids="$pids $!"; done
    bad=0; for j in $pids; do wait $j || bad=$((bad+1)); done
    t1=$(date +%s)
    echo 1 > /sys/bus/pseudo/drivers/scsi_debug/delay # refused while commands are queued
    say "48 reads done in $((t1-t0)) s, $bad failed"
    ok=0; for i in $(seq 0 47); do dd if=/tmp/pat bs=4k count=1 skip=$i 2>/dev/null | cmp -s - /tmp/r$i && ok=$((ok+1)); done
    errs=$(dmesg | tail -n +$((mark+1)) | grep -ci "ping timeout\|conn error\|connection.*error")
    dmesg | tail -n +$((mark+1)) | grep -i "iscsi\|connection" | tail -5
    say "$ok of 48 reads match; $errs connection errors in the kernel log"
    if [ $bad = 0 ] && [ $ok = 48 ] && [ "$errs" = 0 ] && [ $((t1-t0)) -ge 20 ]; then rc=0; fi
    grep -q "connection ended" /tmp/bw.log && { say "blockwire saw the connection end"; rc=1; }
  fi
fi
logout_all
kill $BW; wait $BW || rc=1
[ $rc = 0 ] || tail -30 /tmp/bw.log
exit $rc
