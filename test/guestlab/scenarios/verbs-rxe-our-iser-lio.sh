# verbs-rxe-our-iser-lio: blockwire's iSER initiator, verbs build, on the
# kernel's rdma_rxe against LIO's ib_isert on the same device: the
# verifying benchmark (random writes and reads, QD 1 and 8) and a 4 MiB
# copy in and out.
. /lab/lib-io.sh
. /lab/lib-roce.sh
roce_lab || exit 1
modprobe ib_isert
rm -f /tmp/src /tmp/back /tmp/vini.log
lio_target 3261 $LADDR || exit 1
NP=$CFG/iscsi/$IQN/tpgt_1/np/$LADDR:3261
echo 1 > $NP/iser || { dmesg | tail -5; exit 1; }
U=iser://$LADDR:3261/$IQN/0
V="/lab/bin/blockwire-verbs"
rc=0
bench_copy /tmp/vini.log "1 8" 3s 16MiB /lab/bin/blockwire-verbs "--log-level info --rdma-windows --rdma-device rxe0" && say "copy through LIO isert over kernel rxe readback OK" || rc=1
grep -q "memory windows are not used on rxe0" /tmp/vini.log && say "the initiator refused rxe's memory windows" || { say "no word of rxe's memory windows"; rc=1; }
[ $rc = 0 ] || { tail -20 /tmp/vini.log; dmesg | grep -iE 'isert|rxe' | tail -10; }
echo 0 > $CFG/iscsi/$IQN/tpgt_1/enable
exit $rc
