# our-iser-initiator: blockwire's initiator over iSER (connection-first,
# its userspace iWARP device) against tgt's userspace iSER target, which
# uses the kernel's siw through librdmacm on dummy0 (LIO's isert on siw is
# verbs-siw-our-iser-lio's peer: it needs a second namespace). The
# verifying benchmark (random writes and reads at QD 8) and a 4 MiB copy in
# and out.
rdma_dev siw dummy || exit 1
ulimit -l unlimited   # siw's ibv_reg_mr honours RLIMIT_MEMLOCK; tgt registers a 128 MiB pool
rm -f /tmp/pat /tmp/rb /tmp/src /tmp/back /tmp/ini.log   # the guest's RAM is its disk
dd if=/dev/zero of=/tmp/lun1.img bs=1M count=32 2>/dev/null
tgtd -f --iscsi portal=127.0.0.1:3261 --iser pool_sz_mb=128 > /tmp/tgtd.log 2>&1 &
TGTD=$!
sleep 2
tgtadm --lld iser --mode target --op new --tid 1 -T $IQN || exit 1
tgtadm --lld iser --mode logicalunit --op new --tid 1 --lun 1 -b /tmp/lun1.img --bstype rdwr || exit 1
tgtadm --lld iser --mode target --op bind --tid 1 --initiator-address ALL
tgtadm --lld iser --mode target --op bind --tid 1 --initiator-name iqn.2026-11.org.blockwire:initiator
U=iser://$RADDR:3260/$IQN/1
rc=0
# Short runs: under software emulation tgt's iSER path is slow, and the
# point here is correctness. (Commands stay at 512 KiB over iSER, as Linux
# ib_iser's do: tgt registers a fresh buffer for anything larger, and ran
# the 2 GiB guest out of memory with 1 MiB commands.)
for rw in randwrite randread; do
  timeout 90 /lab/bin/blockwire bench --verify --overwrite --rw $rw --qd 8 --time 3s --size 8MiB $U > /tmp/b.out 2>&1 || rc=1
  grep -E "IOPS=|verify|blockwire:" /tmp/b.out
  cat /tmp/b.out >> /tmp/ini.log
  grep -q "verify: 0 mismatches" /tmp/b.out || { tail -5 /tmp/b.out; rc=1; }
done
dd if=/dev/urandom of=/tmp/src bs=1M count=4 2>/dev/null
timeout 120 /lab/bin/blockwire copy /tmp/src $U 2>> /tmp/ini.log || rc=1
timeout 120 /lab/bin/blockwire read --force $U --length 4MiB --out /tmp/back 2>> /tmp/ini.log || rc=1
cmp /tmp/src /tmp/back && say "copy through tgt iSER readback OK" || rc=1
# tgt sends one-way NOP-Ins (ITT and TTT 0xffffffff); nothing it does may
# cost our initiator its connection.
if grep -E "level=(WARN|ERROR)" /tmp/ini.log; then say "our initiator logged a warning"; rc=1; fi
[ $rc = 0 ] || { tail -20 /tmp/tgtd.log; dmesg | grep -iE 'siw|iw_' | tail -10; }
# tgtd ignores SIGTERM (it wants "tgtadm --op delete --mode system"), and
# its iSER listener holds port 3260 for the scenarios after this one.
kill -9 $TGTD; wait $TGTD 2>/dev/null
exit $rc
