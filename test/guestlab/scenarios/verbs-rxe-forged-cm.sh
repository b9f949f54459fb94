# verbs-rxe-forged-cm: the address blockwire on the kernel's rxe takes for
# a peer is the one librdmacm reports, which for RoCE comes from the
# RDMA/CM header inside the peer's REQ — the peer writes it. forgecm (in
# namespace bw, on its real address) asks for an iSER connection twice:
# with a header that tells the truth, which is accepted, and with one that
# claims 169.254.78.99, which must be refused: a peer that could pass for
# another address would pass an ACL's from and the per-source bounds.
# (Before the check, the second was accepted and its connection ran as
# iser:169.254.78.99.) The CM answers the GID of the REQ's primary path,
# so a peer that names another address there never completes the
# handshake; blockwire refuses a request whose header and path disagree.
. /lab/lib-roce.sh
roce_lab || exit 1
rm -f /tmp/bvf.log
/lab/bin/blockwire-verbs serve --listen $LADDR:3260 --iser=false --roce-listen $LADDR:3260 --rdma-device rxe0 --iqn $IQN --size 64MiB \
  --log-level debug > /tmp/bvf.log 2>&1 &
B=$!
sleep 2
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bvf.log; exit 1; }
rc=0
out=$($BW /lab/bin/forgecm -from $BADDR -to $LADDR -port 3260 -hold 1s 2>&1)
say "a REQ that tells the truth: $out"
echo "$out" | grep -q "forgecm: REP" || { say "the truthful REQ was not accepted"; rc=1; }
out=$($BW /lab/bin/forgecm -from $BADDR -to $LADDR -port 3260 -claim 169.254.78.99 -hold 1s 2>&1)
say "a REQ claiming 169.254.78.99: $out"
echo "$out" | grep -q "forgecm: REJ" || { say "a REQ from $BADDR claiming 169.254.78.99 was not refused"; rc=1; }
grep -q "connection request refused: its RDMA/CM header claims the address 169.254.78.99, its path is to $BADDR" /tmp/bvf.log \
  && say "blockwire refused the claim and said why" || { say "blockwire's log does not name the refused claim"; rc=1; }
grep -q "remote=iser:169.254.78.99" /tmp/bvf.log && { say "a connection ran under the claimed address"; rc=1; }
sleep 1
kill $B; wait $B || { say "blockwire did not stop cleanly"; rc=1; }
[ $rc = 0 ] || grep -vE "verbs: (posted|completion)" /tmp/bvf.log | tail -30
exit $rc
