# verbs-rxe-soft-roce: blockwire on the kernel's rdma_rxe (verbs build,
# rxe0 on va) and blockwire's own software RoCEv2 device (namespace bw, on
# vb) across the veth pair, both ways: the verbs target with the software
# initiator, then the software target with the verbs initiator; the
# verifying benchmark and a copy in and out each way.
. /lab/lib-io.sh
. /lab/lib-roce.sh
roce_lab || exit 1
V="/lab/bin/blockwire-verbs"
rm -f /tmp/vsoft.log
rc=0
# 1. Target on kernel rxe, initiator on the software device.
$V serve --listen 127.0.0.1:3263 --iser=false --roce-listen $LADDR:3264 --rdma-device rxe0 --iqn $IQN --size 64MiB > /tmp/vt.log 2>&1 &
B=$!
sleep 2
kill -0 $B 2>/dev/null || { say "verbs serve did not start"; cat /tmp/vt.log; exit 1; }
U=iser://$LADDR:3264/$IQN/0
bench_copy /tmp/vsoft.log 8 2s 16MiB "$BW /lab/bin/blockwire" "--roce $BADDR" && say "kernel rxe target, software RoCE initiator: copy readback OK" || rc=1
kill $B; wait $B || rc=1
grep -E "level=(WARN|ERROR)" /tmp/vt.log && { say "the verbs target logged warnings"; rc=1; }
# 2. Target on the software device, initiator on kernel rxe.
$BW /lab/bin/blockwire serve --listen 127.0.0.1:3265 --iser=false --roce-listen $BADDR:3266 --iqn $IQN --size 64MiB > /tmp/st.log 2>&1 &
S=$!
sleep 2
kill -0 $S 2>/dev/null || { say "software serve did not start"; cat /tmp/st.log; exit 1; }
U=iser://$BADDR:3266/$IQN/0
bench_copy /tmp/vsoft.log 8 2s 16MiB "$V" "--rdma-device rxe0" && say "software RoCE target, kernel rxe initiator: copy readback OK" || rc=1
kill $S; wait $S || rc=1
grep -E "level=(WARN|ERROR)" /tmp/st.log && { say "the software target logged warnings"; rc=1; }
[ $rc = 0 ] || { tail -20 /tmp/vsoft.log; tail -20 /tmp/vt.log; tail -20 /tmp/st.log; }
exit $rc
