# verbs-siw-remove: verbs-rxe-remove on iWARP — the kernel's siw0 goes
# away under a serving blockwire (rdma link delete siw0) while Linux
# ib_iser has a session on it: the connection ends with a clear log line,
# the process stays up, its iSCSI/TCP portal goes on serving, the deletion
# completes while it runs (a bystander siw device keeps librdmacm's device
# list from going empty); siw0 comes back (rdma link add) and the same
# process serves iSER on it again.
. /lab/lib-io.sh
rdma_dev siw dummy || exit 1
modprobe ib_iser
IP=/usr/bin/ip
$IP link add bystander type dummy && $IP link set bystander up && rdma link add siw_by type siw netdev bystander || exit 1
ulimit -l unlimited
/lab/bin/blockwire-verbs serve --listen $RADDR:3260 --iser=false --roce-listen $RADDR:3261 --rdma-device siw0 --iqn $IQN --size 64MiB > /tmp/bvs.log 2>&1 &
B=$!
sleep 2
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bvs.log; exit 1; }
( sleep 120; say "watchdog: still running after 120 s: the target is stopped"; tail -20 /tmp/bvs.log; dmesg | tail -15; kill $B ) &
W=$!
login_iser() {
  iscsiadm -m node -o new -T $IQN -p $RADDR:3261 -I iser >/dev/null && iscsiadm -m node -T $IQN -p $RADDR:3261 -I iser --login >/dev/null || return 1
  for i in $(seq 1 50); do DEV=$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
  [ -b /dev/$DEV ]
}
rc=0
iscsid_up && login_iser || { say "no iSER session over siw0"; tail -20 /tmp/bvs.log; kill $W $B; exit 1; }
dd if=/dev/urandom of=/dev/$DEV bs=64k count=16 oflag=direct 2>/dev/null || rc=1
iscsiadm -m node -T $IQN -p $RADDR:3261 -I iser -o update -n node.session.timeo.replacement_timeout -v 5 >/dev/null 2>&1
remove_under siw0 $RADDR /tmp/bvs.log; case $? in 1) rc=1 ;; 2) kill $W; exit 1 ;; esac
logout_gone || rc=1
rdma link add siw0 type siw netdev dummy0 || rc=1
for i in $(seq 1 100); do grep -q "the RDMA device is back; serving again" /tmp/bvs.log && break; sleep 0.2; done
grep -q "the RDMA device is back; serving again" /tmp/bvs.log && say "the portal is back" || { say "the portal did not come back"; rc=1; }
if login_iser; then
  dd if=/dev/urandom of=/tmp/pat bs=64k count=16 2>/dev/null
  dd if=/tmp/pat of=/dev/$DEV bs=64k oflag=direct 2>/dev/null && dd if=/dev/$DEV of=/tmp/rb bs=64k count=16 iflag=direct 2>/dev/null && cmp /tmp/pat /tmp/rb && say "siw0 added back: iSER dd readback OK, same process" || rc=1
else
  say "no iSER session after siw0 came back"; rc=1
fi
kill $W 2>/dev/null
logout_all
kill $B; wait $B || { say "blockwire did not stop cleanly"; rc=1; }
rdma link delete siw_by; $IP link delete bystander
grep -E "level=(ERROR|WARN)" /tmp/bvs.log | grep -vE "RDMA device|connection ended" && { say "unexpected warnings"; rc=1; }
[ $rc = 0 ] || { grep -E "level=(WARN|ERROR)" /tmp/bvs.log | tail -20; dmesg | grep -iE 'iser|siw' | tail -10; }
exit $rc
