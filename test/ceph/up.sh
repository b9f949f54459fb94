#!/usr/bin/env bash
# up.sh DIR [MONPORT]: a throwaway single-node Ceph cluster on 127.0.0.1 —
# one monitor and one OSD (memstore: data in RAM), no manager, no systemd —
# for the RBD tests and benchmarks. Writes DIR/ceph.conf (cephx off, so a
# client needs no keyring) and DIR/pids ("name pid" per daemon) for
# down.sh. OBJSTORE=bluestore keeps the data in a sparse file instead.
# Takes about a second; needs Debian's ceph-mon, ceph-osd and ceph-common.
set -euo pipefail
D=${1:?usage: up.sh DIR [MONPORT]}
PORT=${2:-6789}
V2PORT=$((PORT + 1))
OBJSTORE=${OBJSTORE:-memstore}
rm -rf "$D"
mkdir -p "$D"/{mon,osd,run,log}
D=$(cd "$D" && pwd)
FSID=$(cat /proc/sys/kernel/random/uuid)
# The paxos intervals make map changes take milliseconds instead of a
# second each; a pool of size 1 and no health warnings suit one OSD.
cat > "$D/ceph.conf" <<CONF
[global]
fsid = $FSID
mon host = [v2:127.0.0.1:$V2PORT,v1:127.0.0.1:$PORT]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = false
# Clients ping their watches every tick; the tick must come well inside
# the watch timeout below, or busy clients lose their watches.
objecter tick interval = 1
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
paxos propose interval = 0.01
paxos min wait = 0.01
osd crush chooseleaf type = 0
run dir = $D/run
admin socket = $D/run/\$name.asok
log file = $D/log/\$name.log
pid file = $D/run/\$name.pid
keyring = $D/keyring
[client]
# Each client process its own admin socket (several gateways, the tools).
admin socket = $D/run/\$name.\$pid.asok
[mon]
mon data = $D/mon
mon cluster log file = $D/log/cluster.log
[osd]
osd data = $D/osd
osd objectstore = $OBJSTORE
memstore device bytes = 4294967296
bluestore block size = 4294967296
bluestore fsck on mkfs = false
bluestore cache autotune = false
bluestore cache size = 134217728
osd max object name len = 256
osd max object namespace len = 64
# A dead client's watch (a killed gateway holding the exclusive lock)
# expires after this long; the default 30 s is the failover time.
osd client watch timeout = 5
CONF
C=(-c "$D/ceph.conf")
ceph-authtool --create-keyring "$D/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool "$D/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$V2PORT,v1:127.0.0.1:$PORT]" "$D/monmap" >/dev/null
ceph-mon "${C[@]}" --mkfs -i a --monmap "$D/monmap" --keyring "$D/keyring"
# Daemons in the foreground of a background job, output to files: left on
# a pipe, they would hold up whoever reads it.
ceph-mon "${C[@]}" -i a -f </dev/null >"$D/log/mon.out" 2>&1 &
echo "mon $!" >"$D/pids"
OSDUUID=$(cat /proc/sys/kernel/random/uuid)
ID=$(timeout 30 ceph "${C[@]}" osd new "$OSDUUID")
ceph-osd "${C[@]}" -i "$ID" --mkfs --osd-uuid "$OSDUUID" 2>"$D/log/osd-mkfs.err"
ceph-osd "${C[@]}" -i "$ID" -f </dev/null >"$D/log/osd.out" 2>&1 &
echo "osd $!" >>"$D/pids"
for _ in $(seq 1 300); do
	if grep -q '"num_up_osds":1' <<<"$(ceph "${C[@]}" osd stat -f json 2>/dev/null)"; then
		echo "ceph: up, $D/ceph.conf"
		exit 0
	fi
	sleep 0.1
done
echo "ceph: the OSD did not come up; logs in $D/log" >&2
exit 1
