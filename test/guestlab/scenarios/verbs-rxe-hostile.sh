# verbs-rxe-hostile: a hostile RDMA peer against blockwire's verbs build on
# the kernel's rxe (hostile_check in lib-io.sh): while Linux ib_iser has a
# session on the iSER portal, RDMA Writes and Reads under keys blockwire
# never advertised (it registers its memory for local access only) are all
# refused by the kernel (a NAK: remote access error), every such
# connection ends, and blockwire keeps serving: the session's data reads
# back unchanged and new I/O works. (rxe in this kernel raises no
# asynchronous event on the target's side: the connections end when the
# peer goes; verbs-siw-hostile shows the event path.)
. /lab/lib-roce.sh
. /lab/lib-io.sh
roce_lab || exit 1
modprobe ib_iser
ID=0011223344556677
rm -f /tmp/bvh.log /tmp/pat /tmp/rb
/lab/bin/blockwire-verbs serve --listen $LADDR:3260 --iser=false --roce-listen $LADDR:3260 --rdma-device rxe0 --iqn $IQN --size 64MiB \
  --srp-roce-listen $LADDR:5555 --srp-id-ext $ID --log-level debug > /tmp/bvh.log 2>&1 &
B=$!
sleep 2
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bvh.log; exit 1; }
iscsid_up && iscsi_login iser 3260 $LADDR || { tail -20 /tmp/bvh.log; exit 1; }
rc=0
hostile_check /tmp/bvh.log rxe0 $LADDR 3260 5555 $ID || rc=1
kill -0 $B 2>/dev/null || exit 1
logout_all
kill $B; wait $B || { say "blockwire did not stop cleanly"; rc=1; }
grep -E "level=(ERROR|WARN)|panic" /tmp/bvh.log && { say "the target logged warnings"; rc=1; }
[ $rc = 0 ] || grep -vE "verbs: (posted|completion)" /tmp/bvh.log | tail -40
exit $rc
