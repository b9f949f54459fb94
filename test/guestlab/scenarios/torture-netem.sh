# torture-netem: the fault-injection harness (test/torture) with the
# network's own faults. blockwire serve --file runs as the target in
# namespace "tor", behind a veth pair (ta here, tb there); between
# SIGKILLs and restarts of the target, connection resets and partitions,
# netem on both ends of the pair loses, reorders, delays and blackholes
# packets under TCP (tc; the host kernel of CI has no netem, this guest
# does). Over iSCSI/TCP with two connections per session (MC/S), then
# over iSER on the software iWARP device. Each history must check
# linearizable, and netem must have dropped packets.
IP=/usr/bin/ip   # iproute2's, not busybox's applet
modprobe veth; modprobe sch_netem || { say "no netem"; exit 1; }
$IP netns add tor || exit 1
$IP link add ta type veth peer name tb netns tor || exit 1
$IP addr add 169.254.79.1/24 dev ta; $IP link set ta up
$IP -n tor addr add 169.254.79.2/24 dev tb; $IP -n tor link set tb up; $IP -n tor link set lo up
# The target, started (and SIGKILLed) by the harness, in its namespace:
# ip netns exec execs blockwire itself, so the signal reaches it.
printf '#!/bin/sh\nexec /usr/bin/ip netns exec tor /lab/bin/blockwire "$@"\n' > /tmp/bw-tor
chmod +x /tmp/bw-tor
rc=0
for fab in tcp iser; do
  extra=""; [ $fab = tcp ] && extra="-connections 2"
  /lab/bin/torture -duration 45s -seed 13 -fabric $fab $extra -clients 3 -binary /tmp/bw-tor \
    -target-addr 169.254.79.2:3260 -netem ta,tb@tor -fault-every 1500ms \
    -faults crash,reset,partition,loss,reorder,jitter,blackhole > /tmp/tor-$fab.log 2>&1
  r=$?
  sed "s/^/LAB[torture $fab]: /" /tmp/tor-$fab.log | grep -E "operations:|faults:|recovery after|netem:|checker:|verdict:"
  [ $r = 0 ] || { say "torture over $fab: exit $r"; tail -40 /tmp/tor-$fab.log; rc=1; continue; }
  D=$(sed -n 's/^netem: \([0-9]*\) packets dropped.*/\1/p' /tmp/tor-$fab.log)
  [ "${D:-0}" -gt 0 ] && say "$fab: netem dropped $D packets; linearizable" || { say "$fab: netem dropped nothing"; rc=1; }
  for k in crash loss reorder jitter blackhole; do
    grep "^faults:" /tmp/tor-$fab.log | grep -q " $k [1-9]" || { say "$fab: no $k fault injected"; rc=1; }
  done
done
exit $rc
