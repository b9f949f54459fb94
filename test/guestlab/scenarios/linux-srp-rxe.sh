# linux-srp-rxe: blockwire serves SRP over its userspace RoCEv2 device in
# its own namespace; the kernel's ib_srp, over rdma_rxe, logs in through
# RDMA/CM (add_target with dest=: the 56-byte login in the CM REQ's private
# data after the RDMA/CM header), the disk appears, and the I/O and ext4
# checks of linux-initiator-tcp run on it.
. /lab/lib-io.sh
. /lab/lib-roce.sh
roce_lab || exit 1
cap_start linux-srp-rxe
modprobe ib_srp; modprobe sd_mod
rm -f /tmp/pat /tmp/rb
ID=0011223344556677
$BW /lab/bin/blockwire serve --listen 127.0.0.1:3262 --iser=false --iqn $IQN --size 64MiB --srp-roce-listen $BADDR:5555 --srp-id-ext $ID > /tmp/bws.log 2>&1 &
B=$!
sleep 1
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bws.log; exit 1; }
rc=0
srp_disk rxe0-1 $BADDR:5555 $ID /tmp/bws.log || rc=1
kill $B; wait $B || rc=1
grep -E "level=(WARN|ERROR)" /tmp/bws.log && { say "the target logged warnings"; rc=1; }
[ $rc = 0 ] || tail -30 /tmp/bws.log
cap_end $rc
exit $rc
