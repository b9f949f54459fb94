# our-iser-initiator-lio: blockwire's iSER initiator over its userspace
# RoCEv2 device, in its own namespace, against LIO's ib_isert over the
# kernel's rdma_rxe (LIO serves iSER on InfiniBand-style transports only,
# not on siw): the verifying benchmark (random writes and reads, QD 1 and
# 8) and a 4 MiB copy in and out.
. /lab/lib-io.sh
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
bench_copy /tmp/ini.log "1 8" 3s 16MiB "$BW /lab/bin/blockwire" "--roce $BADDR" && say "copy through LIO isert over rxe readback OK" || rc=1
[ $rc = 0 ] || { tail -20 /tmp/ini.log; dmesg | grep -iE 'isert|rxe' | tail -10; }
# LIO's portal stays (one boot, one LIO); the next scenario uses others.
cap_end $rc
exit $rc
