# verbs-siw-linux-iser: blockwire's verbs build serves iSER on the kernel's
# siw (siw0 on dummy0; iWARP, so the RDMA/CM listener is a kernel TCP
# listener: port 3261, beside blockwire's iSCSI/TCP portal on 3260, which
# LIO cannot do on one host); the kernel's ib_iser logs in over siw0 (the
# node record names the iSER portal); the I/O and ext4 checks.
rdma_dev siw dummy || exit 1
modprobe ib_iser
# blockwire rdma names siw0's network device (siw has no GID attributes
# to read it from: the node GUID is made from its MAC address).
/lab/bin/blockwire-verbs rdma | grep siw0 || exit 1
/lab/bin/blockwire-verbs rdma | grep siw0 | grep -q dummy0 || { say "blockwire rdma does not name siw0's network device"; /lab/bin/blockwire-verbs rdma; rdma link show; exit 1; }
rm -f /tmp/pat /tmp/rb
# siw counts registered memory against RLIMIT_MEMLOCK even for root: a
# limit below --rdma-memory is refused at start, by name.
if (ulimit -l 8192; timeout 20 /lab/bin/blockwire-verbs serve --listen $RADDR:3270 --iser=false --roce-listen $RADDR:3271 --rdma-device siw0 --iqn $IQN --size 1MiB) > /tmp/memlock.log 2>&1; then
  say "serve started under an 8 MiB memlock limit"; exit 1
fi
grep -q "RLIMIT_MEMLOCK" /tmp/memlock.log || { cat /tmp/memlock.log; exit 1; }
say "memlock limit reported at start: $(grep -o 'RLIMIT_MEMLOCK[^:]*' /tmp/memlock.log | head -1)"
ulimit -l unlimited
/lab/bin/blockwire-verbs serve --listen $RADDR:3260 --iser=false --roce-listen $RADDR:3261 --rdma-device siw0 --iqn $IQN --size 64MiB > /tmp/bvi.log 2>&1 &
B=$!
sleep 2
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bvi.log; exit 1; }
grep -q 'serving iSER over RDMA/CM.*device=siw0' /tmp/bvi.log || { say "the portal is not on siw0"; cat /tmp/bvi.log; kill $B; exit 1; }
# A stuck I/O (D state) cannot be killed: show what the target saw.
( sleep 120; say "watchdog: still running after 120 s: the target is stopped"; tail -20 /tmp/bvi.log; dmesg | tail -15; kill $B ) &
W=$!
rc=1
if iscsid_up; then
  iscsiadm -m discovery -t st -p $RADDR:3260 | grep -q $IQN || say "discovery over TCP did not list the target"
  iscsiadm -m node -o new -T $IQN -p $RADDR:3261 -I iser >/dev/null && iscsiadm -m node -T $IQN -p $RADDR:3261 -I iser --login && {
    for i in $(seq 1 50); do DEV=$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
    iscsiadm -m session -P 3 | grep -iE 'transport|MaxRecv|FirstBurst|ImmediateData'
    [ -b /dev/$DEV ] && io_test; rc=$?
  }
  grep -q 'remote=iser:' /tmp/bvi.log || { say "the session did not use iSER"; rc=1; }
fi
kill $W 2>/dev/null
logout_all
dmesg | grep -iE 'iser|siw' | grep -v "speed is" | tail -8
kill $B; wait $B || rc=1
grep -E "level=(WARN|ERROR)" /tmp/bvi.log && { say "the target logged warnings"; rc=1; }
[ $rc = 0 ] || tail -30 /tmp/bvi.log
exit $rc
