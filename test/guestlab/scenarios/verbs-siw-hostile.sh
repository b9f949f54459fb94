# verbs-siw-hostile: the hostile RDMA peer of verbs-rxe-hostile against
# blockwire's verbs build on the kernel's siw (iWARP: a bad RDMA Write is
# not acknowledged; the target's side answers with TERMINATE and the
# kernel reports the access violation to blockwire as an asynchronous
# event; a bad Read Request it answers with TERMINATE itself). While Linux
# ib_iser has a session on the iSER portal: every operation refused,
# blockwire logs each refused Write and ends every such connection at
# once, and keeps serving.
. /lab/lib-io.sh
rdma_dev siw dummy || exit 1
ulimit -l unlimited   # siw counts registered memory against it, root too
modprobe ib_iser
ID=0011223344556677
rm -f /tmp/bvh.log /tmp/pat /tmp/rb
/lab/bin/blockwire-verbs serve --listen $RADDR:3260 --iser=false --roce-listen $RADDR:3261 --rdma-device siw0 --iqn $IQN --size 64MiB \
  --srp-roce-listen $RADDR:5555 --srp-id-ext $ID --log-level debug > /tmp/bvh.log 2>&1 &
B=$!
sleep 2
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bvh.log; exit 1; }
rc=0
iscsid_up && iscsiadm -m node -o new -T $IQN -p $RADDR:3261 -I iser >/dev/null && iscsiadm -m node -T $IQN -p $RADDR:3261 -I iser --login >/dev/null || { tail -20 /tmp/bvh.log; exit 1; }
for i in $(seq 1 50); do DEV=$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
hostile_check /tmp/bvh.log siw0 $RADDR 3261 5555 $ID || rc=1
kill -0 $B 2>/dev/null || exit 1
# siw tells the target of each bad RDMA Write (an asynchronous event);
# a bad Read Request it answers with TERMINATE itself, and the connection
# ends. Either way blockwire ends the connection at once, not at the
# login timeout.
# The event may come after the connection ended (the peer's disconnect
# first): it is logged then too, as "had already ended".
v=$(grep -cE 'queue pair error: the connection (ends|had already ended).*outside memory it was given' /tmp/bvh.log)
[ "$v" = 5 ] && say "blockwire logged the 5 refused RDMA Writes: $(grep -m1 -o 'msg="verbs: queue pair error[^"]*".*' /tmp/bvh.log | cut -c1-240)" || { say "refused RDMA Writes logged: $v of 5"; rc=1; }
grep -q "login not complete" /tmp/bvh.log && { say "a hostile connection lasted until the login timeout"; rc=1; }
logout_all
kill $B; wait $B || { say "blockwire did not stop cleanly"; rc=1; }
# Allowed: the hostile connections' lines, and the Linux session's end at
# logout when siw fails a request still in flight as ib_iser closes
# (local QP operation error, catastrophic error: seen once in several runs).
grep -E "level=(ERROR|WARN)|panic" /tmp/bvh.log | grep -vE "queue pair error: the connection (ends|had already ended).*(outside memory|catastrophic)|connection ended.*(outside memory|catastrophic)|completion error.*local QP operation error|srp: channel" && { say "the target logged other warnings"; rc=1; }
[ $rc = 0 ] || grep -vE "verbs: (posted|completion)" /tmp/bvh.log | tail -40
exit $rc
