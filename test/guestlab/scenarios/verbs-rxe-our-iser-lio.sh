# verbs-rxe-our-iser-lio: blockwire's iSER initiator, verbs build, on the
# kernel's rdma_rxe against LIO's ib_isert on the same device: the
# verifying benchmark (random writes and reads, QD 1 and 8) and a 4 MiB
# copy in and out.
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
for rw in randwrite randread; do
  for qd in 1 8; do
    timeout 90 $V bench --rdma-device rxe0 --verify --overwrite --rw $rw --qd $qd --time 3s --size 16MiB $U > /tmp/b.out 2>&1 || rc=1
    grep -E "IOPS=|verify|blockwire:" /tmp/b.out
    cat /tmp/b.out >> /tmp/vini.log
    grep -q "verify: 0 mismatches" /tmp/b.out || { tail -5 /tmp/b.out; rc=1; }
  done
done
dd if=/dev/urandom of=/tmp/src bs=1M count=4 2>/dev/null
timeout 120 $V copy --rdma-device rxe0 /tmp/src $U 2>> /tmp/vini.log || rc=1
timeout 120 $V read --rdma-device rxe0 $U --length 4MiB --out /tmp/back 2>> /tmp/vini.log || rc=1
cmp /tmp/src /tmp/back && say "copy through LIO isert over kernel rxe readback OK" || rc=1
if grep -E "level=(WARN|ERROR)" /tmp/vini.log; then say "our initiator logged a warning"; rc=1; fi
[ $rc = 0 ] || { tail -20 /tmp/vini.log; dmesg | grep -iE 'isert|rxe' | tail -10; }
echo 0 > $CFG/iscsi/$IQN/tpgt_1/enable
exit $rc
