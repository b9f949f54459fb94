# linux-initiator-tcp-digest: as linux-initiator-tcp, with CRC32C header and
# data digests required by the target and turned on in open-iscsi.
/lab/bin/blockwire serve --listen 127.0.0.1:3260 --iqn $IQN --size 64MiB --iser=false \
  --header-digest required --data-digest required > /tmp/bw.log 2>&1 &
BW=$!
sleep 1
rc=1
if iscsid_up && iscsiadm -m discovery -t st -p 127.0.0.1:3260; then
  iscsiadm -m node -T $IQN -p 127.0.0.1:3260 -o update -n 'node.conn[0].iscsi.HeaderDigest' -v CRC32C
  iscsiadm -m node -T $IQN -p 127.0.0.1:3260 -o update -n 'node.conn[0].iscsi.DataDigest' -v CRC32C
  if iscsiadm -m node -T $IQN -p 127.0.0.1:3260 --login; then
    iscsiadm -m session -P 2 | grep -i digest
    for i in $(seq 1 50); do DEV=$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
    io_test; rc=$?
    grep -q "header_digest=true data_digest=true" /tmp/bw.log || { say "digests not in force"; rc=1; }
  fi
fi
logout_all
kill $BW; wait $BW || rc=1
[ $rc = 0 ] || tail -30 /tmp/bw.log
exit $rc
