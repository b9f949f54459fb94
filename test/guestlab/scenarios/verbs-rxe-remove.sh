# verbs-rxe-remove: the kernel RDMA device goes away under a serving
# blockwire (rdma link delete rxe0) while Linux ib_iser has a session on
# it: the connection ends with a clear log line, the process stays up, its
# iSCSI/TCP portal goes on serving; the device comes back (rdma link add)
# and the iSER portal serves again.
. /lab/lib-roce.sh
roce_lab || exit 1
modprobe ib_iser
rm -f /tmp/bvr.log
/lab/bin/blockwire-verbs serve --listen $LADDR:3260 --iser=false --roce-listen $LADDR:3260 --rdma-device rxe0 --iqn $IQN --size 64MiB > /tmp/bvr.log 2>&1 &
B=$!
sleep 2
rc=0
iscsid_up && iscsi_login iser 3260 $LADDR || { tail -20 /tmp/bvr.log; exit 1; }
dd if=/dev/urandom of=/dev/$DEV bs=64k count=16 oflag=direct 2>/dev/null || rc=1
iscsiadm -m node -T $IQN -p $LADDR:3260 -I iser -o update -n node.session.timeo.replacement_timeout -v 5 >/dev/null 2>&1
timeout 60 rdma link delete rxe0; say "rdma link delete rc=$?"
sleep 3
kill -0 $B 2>/dev/null || { say "blockwire died when the device went away"; tail -30 /tmp/bvr.log; exit 1; }
grep -q "RDMA device removed" /tmp/bvr.log && say "removal logged: $(grep -o 'msg="[^"]*RDMA device[^"]*"' /tmp/bvr.log | head -2 | tr '\n' ' ')" || { say "no log line for the removal"; rc=1; }
timeout 30 /lab/bin/blockwire-verbs inquiry iscsi://$LADDR:3260/$IQN/0 > /tmp/inq.out 2>&1 && say "iSCSI/TCP still serves: $(head -1 /tmp/inq.out)" || { cat /tmp/inq.out; rc=1; }
timeout 30 iscsiadm -m node -u >/dev/null 2>&1; iscsiadm -m node -o delete >/dev/null 2>&1
# The device comes back: the portal listens again and a new login works.
rdma link add rxe0 type rxe netdev va || rc=1
for i in $(seq 1 50); do grep -q "the RDMA device is back" /tmp/bvr.log && break; sleep 0.2; done
grep -q "the RDMA device is back" /tmp/bvr.log && say "the portal is back on rxe0" || { say "the portal did not come back"; rc=1; }
if iscsi_login iser 3260 $LADDR; then
  dd if=/dev/urandom of=/tmp/pat bs=64k count=16 2>/dev/null
  dd if=/tmp/pat of=/dev/$DEV bs=64k oflag=direct 2>/dev/null && dd if=/dev/$DEV of=/tmp/rb bs=64k count=16 iflag=direct 2>/dev/null && cmp /tmp/pat /tmp/rb && say "after re-adding the device: dd readback OK" || rc=1
else
  rc=1
fi
logout_all
kill $B; wait $B || rc=1
grep -E "level=(ERROR|WARN)" /tmp/bvr.log | grep -vE "RDMA device|completion error|connection ended|the portal waits" && { say "unexpected warnings"; rc=1; }
[ $rc = 0 ] || tail -40 /tmp/bvr.log
exit $rc
