# linux-iser-rxe: blockwire serves iSER over its userspace RoCEv2 device in
# its own namespace; the kernel's ib_iser, over the kernel's rdma_rxe,
# discovers and logs in through open-iscsi's iser interface (RDMA/CM: an
# InfiniBand CM REQ with the RDMA/CM header, service ID 0x0106 << 16 + 3260,
# then the RC transport); then the I/O and ext4 checks of
# linux-initiator-tcp; then again over IPv6 GIDs (a 4 MiB pattern). Linux
# rxe talks to our RC transport and CM, Linux ib_iser to our iSER target.
. /lab/lib-roce.sh
roce_lab || exit 1
cap_start linux-iser-rxe
modprobe ib_iser
rm -f /tmp/pat /tmp/rb
$BW /lab/bin/blockwire serve --listen $BADDR:3260 --iser=false --roce-listen $BADDR:3260 --roce-listen [$BADDR6]:3260 --iqn $IQN --size 64MiB > /tmp/bwr.log 2>&1 &
B=$!
sleep 1
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bwr.log; exit 1; }
rc=1
if iscsid_up && iscsi_login iser 3260 $BADDR; then
  iscsiadm -m session -P 3 | grep -iE 'transport|MaxRecv|FirstBurst|ImmediateData'
  io_test; rc=$?
  grep -q 'remote=iser:' /tmp/bwr.log || { say "the session did not use iSER"; rc=1; }
fi
logout_all
if [ $rc = 0 ]; then
  # IPv6: rdma_cm resolves fd00:78::2 to its own GID, not an IPv4-mapped one.
  rc=1
  if iscsi_login iser 3260 "[$BADDR6]"; then
    dd if=/dev/urandom of=/tmp/pat6 bs=1M count=4 2>/dev/null
    dd if=/tmp/pat6 of=/dev/$DEV bs=1M oflag=direct 2>/dev/null && dd if=/dev/$DEV of=/tmp/rb6 bs=1M count=4 iflag=direct 2>/dev/null &&
      cmp /tmp/pat6 /tmp/rb6 && say "IPv6 GID: dd pattern readback OK" && rc=0
    grep -q "remote=iser:\[$LADDR6\]" /tmp/bwr.log || { say "no iSER session from the IPv6 address in the target's log"; rc=1; }
  fi
  logout_all
fi
dmesg | grep -iE 'iser|rxe' | tail -8
kill $B; wait $B || rc=1
grep -E "level=(WARN|ERROR)" /tmp/bwr.log && { say "the target logged warnings"; rc=1; }
[ $rc = 0 ] || tail -40 /tmp/bwr.log
cap_end $rc
exit $rc
