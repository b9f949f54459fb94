# siw-rdma: our software iWARP endpoint (test/guestlab/rping, rping's
# protocol on blockwire's rdma/siw) against rdma-core's rping over the
# kernel's soft-iWARP, in both roles: Sends, RDMA Reads and RDMA Writes
# between our MPA/DDP/RDMAP and Linux's, the data checked each time.
rdma_dev siw dummy || exit 1
rc=0
# Linux serves (RDMA-Reads our buffer, RDMA-Writes it back), we are the client and compare.
timeout 60 rping -s -a $RADDR -p 7471 -C 5 > /tmp/rs.out 2>&1 &
S=$!
sleep 1
timeout 60 /lab/bin/gorping -a $RADDR:7471 -C 5 || rc=1
wait $S || { say "rping -s failed"; rc=1; }
# We serve, Linux is the client and validates (-V).
timeout 60 /lab/bin/gorping -s -a $RADDR:7472 -C 5 > /tmp/ours.out 2>&1 &
S=$!
sleep 1
timeout 60 rping -c -a $RADDR -p 7472 -C 5 -v -V || { say "rping -c failed"; rc=1; }
wait $S || { say "our rping server failed"; tail -3 /tmp/ours.out; rc=1; }
[ $rc = 0 ] || { cat /tmp/rs.out; dmesg | grep -iE 'siw|iw_' | grep -v "speed is" | tail -8; }
exit $rc
