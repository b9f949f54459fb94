# linux-srp-siw: blockwire serves SRP (its userspace iWARP device) on the
# guest's dummy0; the kernel's ib_srp, over the kernel's soft-iWARP (siw),
# logs in through RDMA/CM (add_target with dest=, an IPv6 destination),
# the disk appears, and the I/O and ext4 checks of linux-initiator-tcp run
# on it. Linux ib_srp talks to our SRP target, Linux siw to our iWARP.
rdma_dev siw dummy || exit 1
modprobe ib_srp; modprobe sd_mod
ID=0011223344556677
/lab/bin/blockwire serve --listen 127.0.0.1:3262 --iqn $IQN --size 64MiB --srp-listen [::]:5555 --srp-id-ext $ID > /tmp/bws.log 2>&1 &
BW=$!
sleep 1
kill -0 $BW 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bws.log; exit 1; }
rc=0
echo "id_ext=$ID,ioc_guid=$ID,dest=[2001:db8::77:1]:5555,initiator_ext=0000000000000001" > /sys/class/infiniband_srp/srp-siw0-1/add_target || rc=1
for i in $(seq 1 50); do DEV=$(ls /sys/class/scsi_host/*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
if [ -n "$DEV" ] && [ -b /dev/$DEV ]; then
  say "SRP block device /dev/$DEV size $(cat /sys/block/$DEV/size) sectors ($(cat /sys/class/scsi_host/*/proc_name | tr '\n' ' '))"
  io_test || rc=1
  grep -q 'srp: channel up' /tmp/bws.log || { say "no SRP channel in the target's log"; rc=1; }
else
  say "no SRP block device"; rc=1
fi
dmesg | grep -iE 'srp|siw' | grep -v "speed is" | tail -8
for p in /sys/class/srp_remote_ports/port-*; do [ -e $p/delete ] && echo 1 > $p/delete; done
sleep 1
kill $BW; wait $BW || rc=1
grep -E "level=(WARN|ERROR)" /tmp/bws.log && { say "the target logged warnings"; rc=1; }
[ $rc = 0 ] || tail -30 /tmp/bws.log
exit $rc
