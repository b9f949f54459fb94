# linux-initiator-tcp-discovery-chap: discovery sessions need CHAP
# ([discovery] in the configuration): open-iscsi's SendTargets without
# the secret is refused and learns no target; with discovery CHAP set on
# its discovery record it finds the target, logs in (the target itself
# open) and runs the I/O and ext4 checks (issue 20).
cat > /tmp/dchap.toml <<TOML
[discovery.chap]
user = "guest-discovery"
secret = "discovery-secret-1"
[[target]]
name = "$IQN"
[[target.lun]]
id = 0
size = "64MiB"
TOML
/lab/bin/blockwire serve --listen 127.0.0.1:3260 --config /tmp/dchap.toml --iser=false > /tmp/bw.log 2>&1 &
BW=$!
sleep 1
rc=1
if iscsid_up; then
  if iscsiadm -m discovery -t st -p 127.0.0.1:3260 2>&1 | grep -q "$IQN"; then
    say "discovery without CHAP listed the target"
  else
    say "discovery without CHAP refused"
    iscsiadm -m discoverydb -t st -p 127.0.0.1:3260 -o new >/dev/null
    d() { iscsiadm -m discoverydb -t st -p 127.0.0.1:3260 -o update -n "$1" -v "$2"; }
    d discovery.sendtargets.auth.authmethod CHAP
    d discovery.sendtargets.auth.username guest-discovery
    d discovery.sendtargets.auth.password discovery-secret-1
    if iscsiadm -m discoverydb -t st -p 127.0.0.1:3260 --discover | grep -q "$IQN"; then
      say "discovery with CHAP found $IQN"
      if iscsiadm -m node -T $IQN -p 127.0.0.1:3260 --login; then
        for i in $(seq 1 50); do DEV=$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
        io_test; rc=$?
      fi
    fi
  fi
fi
logout_all
iscsiadm -m discoverydb -t st -p 127.0.0.1:3260 -o delete >/dev/null 2>&1
kill $BW; wait $BW || rc=1
grep -q 'status=0201' /tmp/bw.log || { say "the refused discovery is not in the target's log"; rc=1; }
grep -q 'discovery=true' /tmp/bw.log || { say "no discovery session completed"; rc=1; }
[ $rc = 0 ] || tail -30 /tmp/bw.log
exit $rc
