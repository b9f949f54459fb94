# our-initiator-to-lio: LIO (the kernel's iSCSI target, configfs) serves a
# 64 MiB ramdisk; blockwire's initiator runs its verifying benchmark
# (writes and reads, QD 1 and 32) and copies 16 MiB in and out.
lio_target 3260 127.0.0.1 || exit 1
U=iscsi://127.0.0.1:3260/$IQN/0
rc=0
for rw in randwrite randread; do
  for qd in 1 32; do
    /lab/bin/blockwire bench --verify --overwrite --rw $rw --qd $qd --time 3s --size 32MiB $U > /tmp/b.out 2>&1 || rc=1
    grep -E "IOPS=|verify" /tmp/b.out
    grep -q "verify: 0 mismatches" /tmp/b.out || { cat /tmp/b.out; rc=1; }
  done
done
dd if=/dev/urandom of=/tmp/src bs=1M count=16 2>/dev/null
/lab/bin/blockwire copy /tmp/src $U || rc=1
/lab/bin/blockwire read --force $U --length 16MiB --out /tmp/back || rc=1
cmp /tmp/src /tmp/back && say "copy through LIO readback OK" || rc=1
exit $rc
