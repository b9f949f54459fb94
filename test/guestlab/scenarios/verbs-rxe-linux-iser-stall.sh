# verbs-rxe-linux-iser-stall: linux-initiator-tcp-stall over iSER on the
# kernel's rdma_rxe: blockwire's verbs build serves the scsi_debug disk
# (--direct) on rxe0 and the kernel's ib_iser (queue_depth 64) reads while
# the disk stalls (stall_reads in lib-io.sh). iSER's receive completions
# carry the pings: they are answered while commands wait for a worker.
. /lab/lib-roce.sh
. /lab/lib-io.sh
roce_lab || exit 1
modprobe ib_iser
scsi_debug_disk || exit 1
/lab/bin/blockwire-verbs serve --listen $LADDR:3260 --iser=false --roce-listen $LADDR:3260 --rdma-device auto --iqn $IQN --file /dev/$SD --direct > /tmp/bwv.log 2>&1 &
B=$!
sleep 2
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bwv.log; exit 1; }
rc=1
if iscsid_up && iscsiadm -m discovery -t st -p $LADDR:3260 -I iser; then
  iscsiadm -m node -T $IQN -p $LADDR:3260 -I iser -o update -n node.session.queue_depth -v 64
  if iscsiadm -m node -T $IQN -p $LADDR:3260 -I iser --login; then
    for i in $(seq 1 50); do DEV=$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
    stall_reads /tmp/bwv.log; rc=$?
    grep -q 'remote=iser:' /tmp/bwv.log || { say "the session did not use iSER"; rc=1; }
  fi
fi
logout_all
kill $B; wait $B || rc=1
scsi_debug_gone || rc=1
[ $rc = 0 ] || tail -30 /tmp/bwv.log
exit $rc
