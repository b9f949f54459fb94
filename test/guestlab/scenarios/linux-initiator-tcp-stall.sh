# linux-initiator-tcp-stall: blockwire serves a scsi_debug disk (--direct);
# open-iscsi (iscsi_tcp, queue_depth 64) reads while the disk stalls
# (stall_reads in lib-io.sh): its pings are answered while commands wait,
# so no connection error, and every read returns the data written before.
# (When the receiver stopped reading at 33 commands instead, the connection
# was dropped every 12 s, the reads were sent again into the same stall,
# and 43 of them failed after 147 s with DID_TRANSPORT_DISRUPTED.)
. /lab/lib-io.sh
scsi_debug_disk || exit 1
/lab/bin/blockwire serve --listen 127.0.0.1:3260 --iqn $IQN --file /dev/$SD --direct --iser=false > /tmp/bw.log 2>&1 &
BW=$!
sleep 1
rc=1
if iscsid_up && iscsiadm -m discovery -t st -p 127.0.0.1:3260; then
  iscsiadm -m node -T $IQN -p 127.0.0.1:3260 -o update -n node.session.queue_depth -v 64
  if iscsiadm -m node -T $IQN -p 127.0.0.1:3260 --login; then
    for i in $(seq 1 50); do DEV=$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
    stall_reads /tmp/bw.log; rc=$?
  fi
fi
logout_all
kill $BW; wait $BW || rc=1
scsi_debug_gone || rc=1
[ $rc = 0 ] || tail -30 /tmp/bw.log
exit $rc
