# verbs-rxe-remove: the kernel RDMA device goes away under a serving
# blockwire (rdma link delete rxe0) while Linux ib_iser has a session on
# it: the connections end with a clear log line, the process stays up, its
# iSCSI/TCP portal goes on serving, the deletion completes; the device
# comes back (rdma link add) and the same process serves on it again. Then
# a device it does not use goes away, and last the host's only one
# (whose deletion waits for the process to exit: librdmacm).
. /lab/lib-io.sh
. /lab/lib-roce.sh
roce_lab || exit 1
# A bystander device (siw on a dummy link): librdmacm forgets a removed
# device only while another one is listed.
modprobe siw; modprobe dummy
$IP link add bystander type dummy && $IP link set bystander up && rdma link add siw_by type siw netdev bystander || exit 1
modprobe ib_iser
rm -f /tmp/bvr.log
/lab/bin/blockwire-verbs serve --listen $LADDR:3260 --iser=false --roce-listen $LADDR:3260 --rdma-device rxe0 --iqn $IQN --size 64MiB > /tmp/bvr.log 2>&1 &
B=$!
sleep 2
rc=0
iscsid_up && iscsi_login iser 3260 $LADDR || { tail -20 /tmp/bvr.log; exit 1; }
dd if=/dev/urandom of=/dev/$DEV bs=64k count=16 oflag=direct 2>/dev/null || rc=1
iscsiadm -m node -T $IQN -p $LADDR:3260 -I iser -o update -n node.session.timeo.replacement_timeout -v 5 >/dev/null 2>&1
remove_under rxe0 $LADDR /tmp/bvr.log; case $? in 1) rc=1 ;; 2) exit 1 ;; esac
logout_gone || rc=1
# The device comes back: the same process serves on it again.
rdma link add rxe0 type rxe netdev va || rc=1
roce_lab >/dev/null || rc=1 # its GIDs: ib_iser's connection fails until they are there
for i in $(seq 1 100); do grep -q "the RDMA device is back; serving again" /tmp/bvr.log && break; sleep 0.2; done
grep -q "the RDMA device is back; serving again" /tmp/bvr.log && say "the portal is back: $(grep -o 'msg="[^"]*is back[^"]*"' /tmp/bvr.log | head -1)" || { say "the portal did not come back"; rc=1; }
if iscsi_login iser 3260 $LADDR; then
  dd if=/dev/urandom of=/tmp/pat bs=64k count=16 2>/dev/null
  dd if=/tmp/pat of=/dev/$DEV bs=64k oflag=direct 2>/dev/null && dd if=/dev/$DEV of=/tmp/rb bs=64k count=16 iflag=direct 2>/dev/null && cmp /tmp/pat /tmp/rb && say "rxe0 added back: iSER dd readback OK, same process" || rc=1
else
  rc=1
fi
logout_all
# A device blockwire does not use goes away while it runs (librdmacm had
# opened it too): its deletion completes (verbs.Device.forgetRemoved).
rdma link delete siw_by & D=$!
for i in $(seq 1 50); do kill -0 $D 2>/dev/null || break; sleep 0.2; done
if kill -0 $D 2>/dev/null; then
  say "siw_by not deleted while blockwire runs"; kill $B; wait $D; exit 1
fi
say "siw_by, not used by blockwire, deleted while it runs"
# The host's last RDMA device goes away: librdmacm lets go of no removed
# device while the list is empty, so the deletion completes when blockwire
# exits; it stops cleanly meanwhile.
rdma link delete rxe0 & D=$!
sleep 3
kill -0 $D 2>/dev/null && say "rxe0, the last device, waits for blockwire to exit (librdmacm)" || say "rxe0, the last device, deleted while blockwire runs"
kill $B; wait $B || { say "blockwire did not stop cleanly"; rc=1; }
for i in $(seq 1 50); do kill -0 $D 2>/dev/null || break; sleep 0.2; done
kill -0 $D 2>/dev/null && { say "rxe0 still not deleted"; rc=1; } || say "rxe0 deleted"
# The lab as the next scenarios of this boot expect it: rxe0 on va.
$IP link delete bystander
rdma link add rxe0 type rxe netdev va || rc=1
grep -E "level=(ERROR|WARN)" /tmp/bvr.log | grep -vE "RDMA device|connection ended" && { say "unexpected warnings"; rc=1; }
[ $rc = 0 ] || { grep -m1 -B2 -A30 -E "^(SIG|panic|fatal)" /tmp/bvr.log; grep -E "level=(WARN|ERROR)" /tmp/bvr.log | tail -20; }
exit $rc
