# roce-rping: our software RoCEv2 device (test/guestlab/rping -roce, rping's
# protocol over blockwire's InfiniBand RC transport and CM) against
# rdma-core's rping over the kernel's rdma_rxe, in both roles: the CM
# handshake with the RDMA/CM header, Sends, RDMA Reads and RDMA Writes
# between our RC engine and Linux's, the data checked each time.
. /lab/lib-roce.sh
roce_lab || exit 1
cap_start
rc=0
# Linux serves (RDMA-Reads our buffer, RDMA-Writes it back), we are the client and compare.
timeout 60 rping -s -a $LADDR -p 7471 -C 5 -S 4000 > /tmp/rs.out 2>&1 &
S=$!
sleep 1
timeout 60 $BW /lab/bin/gorping -roce $BADDR -a $LADDR:7471 -C 5 -S 4000 > /tmp/oc.out 2>&1 || { say "our rping client failed"; cat /tmp/oc.out; rc=1; }
tail -1 /tmp/oc.out
wait $S || { say "rping -s failed"; rc=1; }
# We serve, Linux is the client and validates (-V).
timeout 60 $BW /lab/bin/gorping -roce $BADDR -s -a $BADDR:7472 -C 5 -S 4000 > /tmp/ours.out 2>&1 &
S=$!
sleep 1
timeout 60 rping -c -a $BADDR -p 7472 -C 5 -S 4000 -v -V > /tmp/lc.out 2>&1 || { say "rping -c failed"; rc=1; }
tail -1 /tmp/lc.out
wait $S || { say "our rping server failed"; tail -3 /tmp/ours.out; rc=1; }
[ $rc = 0 ] && say "rping over rxe against our RoCEv2 device OK in both roles"
[ $rc = 0 ] || { cat /tmp/rs.out /tmp/ours.out /tmp/lc.out; dmesg | grep -iE 'rxe|rdma' | tail -8; }
cap_end $rc
exit $rc
