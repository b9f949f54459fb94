# linux-initiator-tcp: blockwire serves; the guest kernel's open-iscsi
# (iscsi_tcp) discovers (SendTargets), logs in, the block device appears, a
# 16 MiB pattern is written and read back with O_DIRECT, then mkfs.ext4,
# mount, a file written, unmount, caches dropped, mount again and the file
# compared; logout. Sourced by /lab/run.sh (its helpers: say, iscsid_up,
# iscsi_login, io_test, logout_all).
/lab/bin/blockwire serve --listen 127.0.0.1:3260 --iqn $IQN --size 64MiB --iser=false > /tmp/bw.log 2>&1 &
BW=$!
sleep 1
iscsid_up && iscsi_login default 3260 && io_test; rc=$?
logout_all
kill $BW; wait $BW || rc=1
[ $rc = 0 ] || tail -30 /tmp/bw.log
exit $rc
