# verbs-rxe-linux-srp: blockwire's verbs build serves SRP on the kernel's
# rdma_rxe; the kernel's ib_srp logs in through RDMA/CM (add_target with
# dest=: the login in the connection request's private data), the disk
# appears, and the I/O and ext4 checks of linux-initiator-tcp run on it.
. /lab/lib-io.sh
. /lab/lib-roce.sh
roce_lab || exit 1
modprobe ib_srp; modprobe sd_mod
rm -f /tmp/pat /tmp/rb
ID=0011223344556677
/lab/bin/blockwire-verbs serve --listen 127.0.0.1:3262 --iser=false --iqn $IQN --size 64MiB --srp-roce-listen $LADDR:5555 --rdma-device rxe0 --srp-id-ext $ID > /tmp/bvs.log 2>&1 &
B=$!
sleep 2
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bvs.log; exit 1; }
rc=0
srp_disk rxe0-1 $LADDR:5555 $ID /tmp/bvs.log || rc=1
kill $B; wait $B || rc=1
grep -E "level=(WARN|ERROR)" /tmp/bvs.log && { say "the target logged warnings"; rc=1; }
[ $rc = 0 ] || { grep -m1 -A14 -E "^(SIG|panic|fatal)" /tmp/bvs.log; grep -E "level=(WARN|ERROR)|srp" /tmp/bvs.log | head -20; }
exit $rc
