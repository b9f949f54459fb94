# power-cut: the fault-injection harness (test/torture) with a real power
# cut under a file LUN. blockwire serve --file serves a file on ext4 on a
# dm-log-writes device (Linux drivers/md/dm-log-writes.c), which logs
# each write once the kernel has made it durable — after a flush that
# followed it, or at once when it was FUA. At every crash the harness
# SIGKILLs the target and runs /tmp/pc/cut: a mark goes into the log,
# the filesystem and the device are torn down, and a copy of the device
# as it was when logging began gets the writes logged before the mark
# and nothing else (logreplay). Whatever the page cache and the disk's
# volatile cache held is gone, as in a power cut; the target starts
# again on what is left (ext4 replays its journal at mount). So the file
# backend's fdatasync (SYNCHRONIZE CACHE) and RWF_DSYNC writes (FUA, the
# write cache off) are what keep an acknowledged write, and:
#  1. blockwire's history must check linearizable, over iSCSI/TCP with
#     the write cache on, then off, and the cuts must have lost writes
#     that were not durable yet (else the cut proved nothing);
#  2. blockwire-nosync — the same, built with a file backend that never
#     calls fdatasync nor writes with RWF_DSYNC (guestlab_test.go) —
#     must fail it: acknowledged durable writes lost.
modprobe loop; modprobe dm_mod; modprobe dm_log_writes || { say "no dm-log-writes"; exit 1; }
P=/tmp/pc; mkdir -p $P /mnt/pc
cat > $P/cut <<'CUT'
#!/bin/sh
# cut [setup]: the power cut (without "setup"), then logging from the data
# image as it is: a copy kept as the base the next cut replays onto.
P=/tmp/pc
if [ "$1" != setup ]; then
  dmsetup message pc 0 mark powercut || exit 1
  # The killed target's io_uring may hold the file a moment longer.
  for i in $(seq 1 100); do umount /mnt/pc 2>/dev/null && break; sleep 0.1; done
  mountpoint -q /mnt/pc && { echo "cut: /mnt/pc still busy"; exit 1; }
  dmsetup remove pc || exit 1
  losetup -d /dev/loop0; losetup -d /dev/loop1
  /lab/bin/logreplay -log $P/log.img -mark powercut -watch $(cat $P/watch) $P/base.img >> $P/cuts.log 2>&1 ||
    { tail -1 $P/cuts.log; exit 1; }
  mv $P/base.img $P/data.img
fi
cp $P/data.img $P/base.img || exit 1
rm -f $P/log.img; dd if=/dev/zero of=$P/log.img bs=1M count=0 seek=1024 2>/dev/null
losetup /dev/loop0 $P/data.img && losetup /dev/loop1 $P/log.img || exit 1
dmsetup create pc --table "0 $(blockdev --getsz /dev/loop0) log-writes /dev/loop0 /dev/loop1" || exit 1
[ -b /dev/mapper/pc ] || dmsetup mknodes pc
mount -t ext4 /dev/mapper/pc /mnt/pc || { dmesg | tail -5; exit 1; }
CUT
chmod +x $P/cut
# fresh: a 32 MiB ext4 holding the LU's file of zeroes, written whole
# (no block of it allocated under a write), on stable storage before
# logging begins.
fresh() {
  rm -f $P/data.img; dd if=/dev/zero of=$P/data.img bs=1M count=32 2>/dev/null
  mkfs.ext4 -q -F -b 4096 $P/data.img || return 1
  losetup /dev/loop0 $P/data.img && mount -t ext4 /dev/loop0 /mnt/pc || return 1
  dd if=/dev/zero of=/mnt/pc/lun.img bs=4096 count=16 2>/dev/null; sync
  umount /mnt/pc && losetup -d /dev/loop0 || return 1
  # The file's extent on the device: the cuts count the lost writes in it.
  B=$(debugfs -R "blocks /lun.img" $P/data.img 2>/dev/null)
  set -- $B
  first=$1; last=$(eval echo \${$#})
  [ $# = 16 ] && [ $((last - first)) = 15 ] || { say "lun.img is not one extent of 16 blocks: $B"; return 1; }
  echo "$((first * 4096)):65536" > $P/watch
}
rc=0
for bin in blockwire blockwire-nosync; do
  for wc in on off; do
    [ $bin = blockwire-nosync ] && [ $wc = off ] && continue
    : > $P/cuts.log
    fresh && $P/cut setup || { say "setting up the log failed"; exit 1; }
    extra=""; [ $wc = off ] && extra="-write-through"
    /lab/bin/torture -duration 30s -seed 17 -clients 3 $extra -binary /lab/bin/$bin -lun-file /mnt/pc/lun.img \
      -power-cut $P/cut -fault-every 1500ms -faults crash,reset > /tmp/pc-$bin-$wc.log 2>&1
    r=$?
    sed "s/^/LAB[power-cut $bin cache $wc]: /" /tmp/pc-$bin-$wc.log | grep -E "operations:|faults:|recovery after|checker:|verdict:|implausible:|^torture:"
    LOST=$(sed -n 's/.* \([0-9]*\) writes after it lost.*/\1/p' $P/cuts.log | awk '{s+=$1} END {print s+0}')
    LOSTIN=$(sed -n 's/.* \([0-9]*\) of them in the watched range$/\1/p' $P/cuts.log | awk '{s+=$1} END {print s+0}')
    CUTS=$(grep -c "up to mark" $P/cuts.log)
    say "$bin, write cache $wc: $CUTS power cuts; they lost $LOST writes not yet durable, $LOSTIN of them to the LU's file"
    if [ $bin = blockwire ]; then
      [ $r = 0 ] || { say "blockwire, write cache $wc: exit $r"; tail -30 /tmp/pc-$bin-$wc.log; rc=1; }
      [ "$CUTS" -gt 0 ] || { say "no power cut"; rc=1; }
      [ $wc = on ] && { [ "$LOSTIN" -gt 0 ] || { say "the cuts lost no write to the LU's file: they proved nothing"; rc=1; }; }
    else
      grep -q "NOT linearizable" /tmp/pc-$bin-$wc.log && say "blockwire-nosync: caught (NOT linearizable), as it must be" ||
        { say "blockwire-nosync: the power cut let a backend that never syncs through (exit $r)"; tail -30 /tmp/pc-$bin-$wc.log; rc=1; }
    fi
    # Tear down for the next run (no cut: nothing is checked after it).
    umount /mnt/pc; dmsetup remove pc; losetup -d /dev/loop0; losetup -d /dev/loop1
  done
done
exit $rc
