# verbs-siw-our-srp-lio: blockwire's SRP initiator, verbs build, on the
# kernel's siw against LIO's ib_srpt on the same device, reached through
# RDMA/CM on port 5557 (ib_srpt listens on [::], so an IPv6 destination):
# the verifying benchmark at QD 1 and 16, and a 4 MiB copy in and out.
. /lab/lib-io.sh
rdma_dev siw dummy || exit 1
ulimit -l unlimited   # siw counts registered memory against it, root too
modprobe target_core_mod; modprobe ib_srpt
mkdir -p $CFG/srpt; echo 5557 > $CFG/srpt/discovery_auth/rdma_cm_port || exit 1
if [ ! -d $CFG/core/rd_mcp_0/rd0 ]; then mkdir -p $CFG/core/rd_mcp_0/rd0; echo rd_pages=16384 > $CFG/core/rd_mcp_0/rd0/control; echo 1 > $CFG/core/rd_mcp_0/rd0/enable; fi
GID=$(cat /sys/class/infiniband/siw0/ports/1/gids/0 | tr -d :)
IID=$(echo $GID | cut -c17-32); IIDC=$(echo $IID | sed 's/\(....\)\(....\)\(....\)\(....\)/\1:\2:\3:\4/')
for P in $IIDC 0x$GID; do mkdir $CFG/srpt/$P 2>/dev/null && break; done
T=$CFG/srpt/$P/tpgt_1; [ -d $T ] || mkdir $T || exit 1
mkdir -p $T/lun/lun_0; [ -e $T/lun/lun_0/rd0 ] || ln -s $CFG/core/rd_mcp_0/rd0 $T/lun/lun_0/rd0
# srpt names an RDMA/CM session by its source address, fully expanded.
A=$T/acls/2001:0db8:0000:0000:0000:0000:0077:0001
mkdir -p $A/lun_0 && { [ -e $A/lun_0/map ] || ln -s $T/lun/lun_0 $A/lun_0/map; }
echo 1 > $T/enable
NG=$(cat /sys/class/infiniband/siw0/node_guid | tr -d :)   # srpt's target port ID: the node GUID, twice
U="srp://[2001:db8::77:1]:5557/$NG:$NG/0"
rm -f /tmp/src /tmp/back /tmp/srpi.log /tmp/pat /tmp/rb
rc=0
bench_copy /tmp/srpi.log "1 16" 2s 8MiB /lab/bin/blockwire-verbs "--log-level info --rdma-windows --rdma-device siw0" && say "copy through ib_srpt readback OK" || rc=1
grep -q "one key (no memory windows" /tmp/srpi.log && say "siw0 has no memory windows: one key per chunk" || rc=1
[ $rc = 0 ] || dmesg | grep -iE "srp|siw|iw_" | grep -v "speed is" | tail -40
echo 0 > $T/enable
exit $rc
