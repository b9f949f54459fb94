# linux-nvme-tcp: blockwire serves its default LUN over NVMe/TCP (and over
# iSCSI on a port of its own: an earlier scenario's LIO may hold 3260);
# the guest kernel's nvme-tcp host, driven by nvme-cli, discovers the
# subsystem (the discovery log), connects (without digests, then with
# header and data digests), and on /dev/nvmeXnY: nvme id-ctrl, id-ns,
# smart-log, error-log, fw-log, flush, write-zeroes, dsm --ad (each block
# reads back zeroes), compare (same data: success; other: failure),
# resv-register/acquire/report/release (another host — blockwire's own —
# refused a write and allowed a read under Write Exclusive), then ext4 with 300 files of random sizes and their
# checksums; disconnect, reconnect, e2fsck clean, every checksum again.
# blockwire's admin API shows the controller while connected and none
# after the last disconnect. Sourced by /lab/run.sh.
H=nqn.2014-08.org.nvmexpress:uuid:5eb1f0a7-0000-4000-8000-000000000001
NQN=nqn.2026-11.io.blockwire:$IQN
/lab/bin/blockwire serve --listen 127.0.0.1:3263 --nvme-listen 127.0.0.1:4420 --iqn $IQN --size 256MiB --iser=false \
  --admin-socket /tmp/adm.sock > /tmp/bw.log 2>&1 &
BW=$!
sleep 1
modprobe nvme_tcp || { say "no nvme_tcp module"; exit 1; }
rc=0
nvme_dev() { # waits for the namespace's block device of subsystem $NQN (with
  # native multipath, the subsystem's head nvmeXn1; without, the controller's)
  for i in $(seq 1 50); do
    for s in /sys/class/nvme-subsystem/nvme-subsys*; do
      [ "$(cat $s/subsysnqn 2>/dev/null)" = "$NQN" ] || continue
      CTRL=$(ls $s | grep -E '^nvme[0-9]+$' | head -1)
      DEV=$(ls $s /sys/class/nvme/$CTRL 2>/dev/null | grep -E '^nvme[0-9]+n1$' | head -1)
      [ -n "$DEV" ] && [ -b /dev/$DEV ] && return 0
    done
    sleep 0.2
  done
  say "no NVMe block device for $NQN"; ls /sys/class/nvme-subsystem/* /sys/block; return 1
}
connect() { nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $NQN --hostnqn $H "$@" && nvme_dev; }
nvme discover -t tcp -a 127.0.0.1 -s 4420 --hostnqn $H > /tmp/disc.out 2>&1 || rc=1
cat /tmp/disc.out | grep -E 'subnqn|traddr|trsvcid|subtype' | head -8
grep -q "$NQN" /tmp/disc.out || { say "the discovery log lacks $NQN"; rc=1; }
if connect; then
  say "connected: /dev/$DEV on $CTRL, $(cat /sys/block/$DEV/size) sectors"
  nvme list 2>&1 | tail -2
  nvme id-ctrl /dev/$CTRL | grep -E '^(mn|sn|subnqn|cntrltype|ioccsz|kas|oncs|vwc|sgls) ' || rc=1
  nvme id-ns /dev/$DEV | grep -E '^(nsze|nguid|dlfeat)|in use' || rc=1
  nvme smart-log /dev/$CTRL > /dev/null || { say "smart-log failed"; rc=1; }
  nvme error-log /dev/$CTRL -e 1 > /dev/null || { say "error-log failed"; rc=1; }
  nvme fw-log /dev/$CTRL > /dev/null || { say "fw-log failed"; rc=1; }
  dd if=/dev/urandom of=/dev/$DEV bs=4k count=64 oflag=direct 2>/dev/null
  nvme flush /dev/$DEV -n 1 || { say "flush failed"; rc=1; }
  nvme write-zeroes /dev/$DEV -n 1 -s 0 -c 63 || { say "write-zeroes failed"; rc=1; }
  nvme dsm /dev/$DEV -n 1 --ad -s 64 -b 64 || { say "dsm --ad failed"; rc=1; }
  head -c 65536 /dev/zero > /tmp/z
  dd if=/dev/$DEV of=/tmp/zr bs=64k count=1 iflag=direct 2>/dev/null
  cmp /tmp/z /tmp/zr && say "write-zeroes read back zeroes" || { say "write-zeroes left data"; rc=1; }
  dd if=/dev/$DEV of=/tmp/zr bs=32k skip=1 count=1 iflag=direct 2>/dev/null
  cmp /tmp/z /tmp/zr 2>/dev/null | head -1; head -c 32768 /dev/zero | cmp - /tmp/zr && say "deallocated blocks read back zeroes" || { say "dsm --ad left data"; rc=1; }
  # compare: the blocks as read match; one byte changed does not.
  dd if=/dev/$DEV of=/tmp/cmp bs=4096 count=1 skip=2 iflag=direct 2>/dev/null
  nvme compare /dev/$DEV -s 16 -c 7 -z 4096 -d /tmp/cmp > /dev/null 2>&1 && say "compare of the same data: success" || { say "compare of the same data failed"; rc=1; }
  printf '\x5a' | dd of=/tmp/cmp bs=1 seek=100 conv=notrunc 2>/dev/null
  nvme compare /dev/$DEV -s 16 -c 7 -z 4096 -d /tmp/cmp > /tmp/cmp.out 2>&1 && { say "compare of other data succeeded"; rc=1; } || say "compare of other data: $(tail -1 /tmp/cmp.out)"
  # Reservations: this host registers and takes Write Exclusive; another
  # host (blockwire's own, another host identifier) may read but not
  # write; release and unregister; the report at each step.
  nvme resv-register /dev/$DEV -n 1 --nrkey=0xb1 --rrega=0 || { say "resv-register failed"; rc=1; }
  nvme resv-acquire /dev/$DEV -n 1 --crkey=0xb1 --rtype=1 --racqa=0 || { say "resv-acquire failed"; rc=1; }
  nvme resv-report /dev/$DEV -n 1 --eds -o json > /tmp/resv.out 2>&1 || { say "resv-report failed"; rc=1; }
  tr -d ' \n' < /tmp/resv.out > /tmp/resv.one; cat /tmp/resv.one; echo
  grep -q '"rtype":1,' /tmp/resv.one && grep -q '"regctl":1,' /tmp/resv.one && grep -q '"rkey":177' /tmp/resv.one \
    && say "resv-report: Write Exclusive, one registrant, key 0xb1" || { say "resv-report lacks the reservation"; rc=1; }
  head -c 512 /dev/urandom > /tmp/blk
  if /lab/bin/blockwire write -overwrite -in /tmp/blk nvme+tcp://127.0.0.1:4420/$NQN/1 > /tmp/w.out 2>&1; then
    say "another host wrote under Write Exclusive"; rc=1
  else
    grep -q "Reservation Conflict" /tmp/w.out && say "another host's write: Reservation Conflict" || { cat /tmp/w.out; rc=1; }
  fi
  /lab/bin/blockwire read -length 4096 -out /tmp/r.out nvme+tcp://127.0.0.1:4420/$NQN/1 > /dev/null 2>&1 \
    && say "another host's read under Write Exclusive: allowed" || { say "another host's read refused"; rc=1; }
  dd if=/tmp/blk of=/dev/$DEV bs=512 count=1 seek=8 oflag=direct 2>/dev/null && say "the holder writes" || { say "the holder's write failed"; rc=1; }
  nvme resv-release /dev/$DEV -n 1 --crkey=0xb1 --rtype=1 --rrela=0 || { say "resv-release failed"; rc=1; }
  nvme resv-register /dev/$DEV -n 1 --crkey=0xb1 --rrega=1 || { say "resv-register (unregister) failed"; rc=1; }
  nvme resv-report /dev/$DEV -n 1 --eds -o json 2>&1 | tr -d ' \n' | grep -q '"regctl":0,' && say "released and unregistered" || { say "a registration left behind"; rc=1; }
  /lab/bin/blockwire admin --socket /tmp/adm.sock sessions > /tmp/sess.out 2>&1
  grep -q "$H" /tmp/sess.out && say "the admin API shows the NVMe controller" || { cat /tmp/sess.out; say "no NVMe controller among the sessions"; rc=1; }
  # ext4 with 300 files, their checksums, across a disconnect.
  mkfs.ext4 -q -F /dev/$DEV || rc=1
  modprobe ext4; mount -t ext4 /dev/$DEV /mnt || rc=1
  mkdir -p /mnt/d
  for i in $(seq 1 300); do head -c $(( (i * 7919) % 65536 + 1 )) /dev/urandom > /mnt/d/f$i; done
  (cd /mnt/d && md5sum f* > /tmp/sums)
  umount /mnt || rc=1
  nvme disconnect -n $NQN || rc=1
  sleep 1
  if connect -g -G; then
    say "reconnected with header and data digests: /dev/$DEV"
    e2fsck -fn /dev/$DEV > /tmp/fsck.out 2>&1 && say "e2fsck clean" || { tail -5 /tmp/fsck.out; rc=1; }
    mount -t ext4 /dev/$DEV /mnt && (cd /mnt/d && md5sum -c /tmp/sums > /tmp/sums.out 2>&1) \
      && say "300 checksums match after the reconnect" || { grep -v OK /tmp/sums.out | head -5; rc=1; }
    umount /mnt
    grep -q "header_digest=true data_digest=true" /tmp/bw.log && say "digests in force" || { say "digests not in force"; rc=1; }
    nvme disconnect -n $NQN || rc=1
  else
    rc=1
  fi
else
  rc=1
fi
sleep 1
/lab/bin/blockwire admin --socket /tmp/adm.sock sessions > /tmp/sess.out 2>&1
grep -q "$H" /tmp/sess.out && { say "an NVMe controller left behind after disconnect"; cat /tmp/sess.out; rc=1; }
dmesg | grep -i nvme | tail -6
kill $BW; wait $BW || rc=1
[ $rc = 0 ] || tail -30 /tmp/bw.log
exit $rc
