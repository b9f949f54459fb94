# linux-initiator-tcp-chap: as linux-initiator-tcp, with mutual CHAP: the
# target checks open-iscsi's CHAP response and open-iscsi checks ours.
cat > /tmp/chap.toml <<TOML
[[target]]
name = "$IQN"
[target.chap]
user = "guest-initiator"
secret = "initiator-secret-1"
[target.mutual_chap]
user = "blockwire-target"
secret = "target-secret-22"
[[target.lun]]
id = 0
size = "64MiB"
TOML
/lab/bin/blockwire serve --listen 127.0.0.1:3260 --config /tmp/chap.toml --iser=false > /tmp/bw.log 2>&1 &
BW=$!
sleep 1
rc=1
if iscsid_up && iscsiadm -m discovery -t st -p 127.0.0.1:3260; then
  n() { iscsiadm -m node -T $IQN -p 127.0.0.1:3260 -o update -n "$1" -v "$2"; }
  n node.session.auth.authmethod CHAP
  n node.session.auth.username guest-initiator
  n node.session.auth.password initiator-secret-1
  n node.session.auth.username_in blockwire-target
  n node.session.auth.password_in target-secret-22
  if iscsiadm -m node -T $IQN -p 127.0.0.1:3260 --login; then
    for i in $(seq 1 50); do DEV=$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
    grep -q "authmethod=CHAP\|CHAP" /tmp/bw.log || true
    io_test; rc=$?
  fi
fi
logout_all
kill $BW; wait $BW || rc=1
grep -q 'initiator=iqn.2004-10.org.guestlab:initiator' /tmp/bw.log || rc=1
[ $rc = 0 ] || tail -30 /tmp/bw.log
exit $rc
