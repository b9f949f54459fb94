# roce-rping: our software RoCEv2 device (test/guestlab/rping -roce, rping's
# protocol over blockwire's InfiniBand RC transport and CM) against
# rdma-core's rping over the kernel's rdma_rxe, in both roles and with
# both kinds of RoCEv2 GID (IPv4-mapped and IPv6): the CM handshake with
# the RDMA/CM header, Sends, RDMA Reads and RDMA Writes of 4000 bytes (four
# 1024-byte packets) between our RC engine and Linux's, the data checked
# each time.
. /lab/lib-roce.sh
roce_lab || exit 1
cap_start roce-rping
rc=0
for fam in 4 6; do
  if [ $fam = 4 ]; then L=$LADDR; B=$BADDR; LP=$LADDR:7471; BP=$BADDR:7472
  else L=$LADDR6; B=$BADDR6; LP=[$LADDR6]:7473; BP=[$BADDR6]:7474; fi
  # Linux serves (RDMA-Reads our buffer, RDMA-Writes it back), we are the client and compare.
  timeout 60 rping -s -a $L -p ${LP##*:} -C 5 -S 4000 > /tmp/rs.out 2>&1 &
  S=$!
  sleep 1
  timeout 60 $BW /lab/bin/gorping -roce $B -a $LP -C 5 -S 4000 > /tmp/oc.out 2>&1 || { say "IPv$fam: our rping client failed"; cat /tmp/oc.out; rc=1; }
  tail -1 /tmp/oc.out | cut -c1-60
  wait $S || { say "IPv$fam: rping -s failed"; cat /tmp/rs.out; rc=1; }
  # We serve, Linux is the client and validates (-V).
  timeout 60 $BW /lab/bin/gorping -roce $B -s -a $BP -C 5 -S 4000 > /tmp/ours.out 2>&1 &
  S=$!
  sleep 1
  timeout 60 rping -c -a $B -p ${BP##*:} -C 5 -S 4000 -v -V > /tmp/lc.out 2>&1 || { say "IPv$fam: rping -c failed"; cat /tmp/lc.out; rc=1; }
  tail -1 /tmp/lc.out | cut -c1-60
  wait $S || { say "IPv$fam: our rping server failed"; tail -3 /tmp/ours.out; rc=1; }
  [ $rc = 0 ] && say "IPv$fam: rping over rxe against our RoCEv2 device OK in both roles"
done
[ $rc = 0 ] || dmesg | grep -iE 'rxe|rdma' | tail -8
cap_end $rc
exit $rc
