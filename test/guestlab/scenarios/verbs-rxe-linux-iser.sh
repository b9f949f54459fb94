# verbs-rxe-linux-iser: blockwire's verbs build serves iSER on the kernel's
# rdma_rxe (rxe0 on va, through rdma-core: librdmacm in the RDMA_PS_TCP
# port space, libibverbs queue pairs); the kernel's ib_iser discovers
# (iSCSI/TCP on the same address) and logs in over rxe0; the I/O and ext4
# checks of linux-initiator-tcp; then again over the IPv6 GID.
. /lab/lib-roce.sh
roce_lab || exit 1
modprobe ib_iser
/lab/bin/blockwire-verbs rdma || exit 1
rm -f /tmp/pat /tmp/rb
/lab/bin/blockwire-verbs serve --listen $LADDR:3260 --iser=false --roce-listen $LADDR:3260 --roce-listen [$LADDR6]:3260 --rdma-device auto --iqn $IQN --size 64MiB > /tmp/bwv.log 2>&1 &
B=$!
sleep 2
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bwv.log; exit 1; }
grep -q 'serving iSER over RDMA/CM.*device=rxe0' /tmp/bwv.log || { say "the portal is not on rxe0"; cat /tmp/bwv.log; kill $B; exit 1; }
rc=1
if iscsid_up && iscsi_login iser 3260 $LADDR; then
  iscsiadm -m session -P 3 | grep -iE 'transport|MaxRecv|FirstBurst|ImmediateData'
  io_test; rc=$?
  grep -q 'remote=iser:' /tmp/bwv.log || { say "the session did not use iSER"; rc=1; }
fi
logout_all
if [ $rc = 0 ]; then
  rc=1
  if iscsi_login iser 3260 "[$LADDR6]"; then
    dd if=/dev/urandom of=/tmp/pat6 bs=1M count=4 2>/dev/null
    dd if=/tmp/pat6 of=/dev/$DEV bs=1M oflag=direct 2>/dev/null && dd if=/dev/$DEV of=/tmp/rb6 bs=1M count=4 iflag=direct 2>/dev/null &&
      cmp /tmp/pat6 /tmp/rb6 && say "IPv6 GID: dd pattern readback OK" && rc=0
  fi
  logout_all
fi
dmesg | grep -iE 'iser|rxe' | tail -8
kill $B; wait $B || rc=1
grep -E "level=(WARN|ERROR)" /tmp/bwv.log && { say "the target logged warnings"; rc=1; }
[ $rc = 0 ] || tail -40 /tmp/bwv.log
exit $rc
