# verbs-siw-linux-srp: blockwire's verbs build serves SRP on the kernel's
# siw; the kernel's ib_srp logs in through RDMA/CM (IPv6 destination, as
# with LIO's srpt over siw), the disk appears, the I/O and ext4 checks.
rdma_dev siw dummy || exit 1
ulimit -l unlimited   # siw counts registered memory against it, root too
modprobe ib_srp; modprobe sd_mod
rm -f /tmp/pat /tmp/rb
ID=0011223344556677
/lab/bin/blockwire-verbs serve --listen 127.0.0.1:3262 --iser=false --iqn $IQN --size 64MiB --srp-roce-listen [2001:db8::77:1]:5555 --rdma-device siw0 --srp-id-ext $ID > /tmp/bvs.log 2>&1 &
B=$!
sleep 2
kill -0 $B 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bvs.log; exit 1; }
rc=0
echo "id_ext=$ID,ioc_guid=$ID,dest=[2001:db8::77:1]:5555,initiator_ext=0000000000000002" > /sys/class/infiniband_srp/srp-siw0-1/add_target || rc=1
for i in $(seq 1 50); do DEV=$(ls /sys/class/scsi_host/*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
if [ -n "$DEV" ] && [ -b /dev/$DEV ]; then
  say "SRP block device /dev/$DEV size $(cat /sys/block/$DEV/size) sectors"
  io_test || rc=1
  grep -q 'srp: channel up' /tmp/bvs.log || { say "no SRP channel in the target's log"; rc=1; }
else
  say "no SRP block device"; rc=1
fi
dmesg | grep -iE 'srp|siw' | grep -v "speed is" | tail -8
for p in /sys/class/srp_remote_ports/port-*; do [ -e $p/delete ] && echo 1 > $p/delete; done
sleep 1
kill $B; wait $B || rc=1
grep -E "level=(WARN|ERROR)" /tmp/bvs.log && { say "the target logged warnings"; rc=1; }
[ $rc = 0 ] || { grep -m1 -A14 -E "^(SIG|panic|fatal)" /tmp/bvs.log; grep -E "level=(WARN|ERROR)|srp" /tmp/bvs.log | head -20; }
exit $rc
