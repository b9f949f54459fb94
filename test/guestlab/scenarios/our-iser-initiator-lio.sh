# our-iser-initiator-lio: blockwire's iSER initiator over its userspace
# RoCEv2 device, in its own namespace, against LIO's ib_isert over the
# kernel's rdma_rxe (LIO serves iSER on InfiniBand-style transports only,
# not on siw): the verifying benchmark (random writes and reads, QD 1 and
# 8) and a 4 MiB copy in and out.
. /lab/lib-roce.sh
roce_lab || exit 1
cap_start our-iser-initiator-lio
modprobe ib_isert
rm -f /tmp/pat /tmp/rb /tmp/src /tmp/back /tmp/ini.log
lio_target 3260 $LADDR || exit 1
NP=$CFG/iscsi/$IQN/tpgt_1/np/$LADDR:3260
echo 1 > $NP/iser || { dmesg | tail -5; exit 1; }
say "LIO iser enabled on np $LADDR:3260: $(cat $NP/iser)"
U=iser://$LADDR:3260/$IQN/0
rc=0
for rw in randwrite randread; do
  for qd in 1 8; do
    timeout 90 $BW /lab/bin/blockwire bench --roce $BADDR --verify --overwrite --rw $rw --qd $qd --time 3s --size 16MiB $U > /tmp/b.out 2>&1 || rc=1
    grep -E "IOPS=|verify|blockwire:" /tmp/b.out
    cat /tmp/b.out >> /tmp/ini.log
    grep -q "verify: 0 mismatches" /tmp/b.out || { tail -5 /tmp/b.out; rc=1; }
  done
done
dd if=/dev/urandom of=/tmp/src bs=1M count=4 2>/dev/null
timeout 120 $BW /lab/bin/blockwire copy --roce $BADDR /tmp/src $U 2>> /tmp/ini.log || rc=1
timeout 120 $BW /lab/bin/blockwire read --roce $BADDR $U --length 4MiB --out /tmp/back 2>> /tmp/ini.log || rc=1
cmp /tmp/src /tmp/back && say "copy through LIO isert over rxe readback OK" || rc=1
if grep -E "level=(WARN|ERROR)" /tmp/ini.log; then say "our initiator logged a warning"; rc=1; fi
[ $rc = 0 ] || { tail -20 /tmp/ini.log; dmesg | grep -iE 'isert|rxe' | tail -10; }
# LIO's portal stays (one boot, one LIO); the next scenario uses others.
cap_end $rc
exit $rc
