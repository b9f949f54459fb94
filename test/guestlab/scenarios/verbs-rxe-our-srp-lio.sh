# verbs-rxe-our-srp-lio: blockwire's SRP initiator, verbs build, on the
# kernel's rdma_rxe against LIO's ib_srpt (RDMA/CM port 5556): the
# verifying benchmark at QD 1 and 16, and a 4 MiB copy in and out.
. /lab/lib-io.sh
. /lab/lib-roce.sh
roce_lab || exit 1
modprobe target_core_mod; modprobe ib_srpt
mkdir -p $CFG/srpt; echo 5556 > $CFG/srpt/discovery_auth/rdma_cm_port || exit 1
if [ ! -d $CFG/core/rd_mcp_0/rd0 ]; then mkdir -p $CFG/core/rd_mcp_0/rd0; echo rd_pages=16384 > $CFG/core/rd_mcp_0/rd0/control; echo 1 > $CFG/core/rd_mcp_0/rd0/enable; fi
GID=$(cat /sys/class/infiniband/rxe0/ports/1/gids/0 | tr -d :)
IID=$(echo $GID | cut -c17-32); IIDC=$(echo $IID | sed 's/\(....\)\(....\)\(....\)\(....\)/\1:\2:\3:\4/')
for P in $IIDC 0x$GID; do mkdir $CFG/srpt/$P 2>/dev/null && break; done
T=$CFG/srpt/$P/tpgt_1; [ -d $T ] || mkdir $T || exit 1
mkdir -p $T/lun/lun_0; [ -e $T/lun/lun_0/rd0 ] || ln -s $CFG/core/rd_mcp_0/rd0 $T/lun/lun_0/rd0
# srpt names an RDMA/CM session by its source address.
A=$T/acls/$LADDR
mkdir -p $A/lun_0 && { [ -e $A/lun_0/map ] || ln -s $T/lun/lun_0 $A/lun_0/map; }
echo 1 > $T/enable
NG=$(cat /sys/class/infiniband/rxe0/node_guid | tr -d :)   # srpt's target port ID: the node GUID, twice
U="srp://$LADDR:5556/$NG:$NG/0"
V="/lab/bin/blockwire-verbs"
rm -f /tmp/src /tmp/back /tmp/vsrpi.log
rc=0
bench_copy /tmp/vsrpi.log "1 16" 2s 8MiB /lab/bin/blockwire-verbs "--log-level info --rdma-windows --rdma-device rxe0" && say "copy through ib_srpt over kernel rxe readback OK" || rc=1
grep -q "memory windows are not used on rxe0" /tmp/vsrpi.log && say "the initiator refused rxe's memory windows" || { say "no word of rxe's memory windows"; rc=1; }
[ $rc = 0 ] || { tail -20 /tmp/vsrpi.log; dmesg | grep -iE 'srp|rxe' | tail -12; }
echo 0 > $T/enable
exit $rc
