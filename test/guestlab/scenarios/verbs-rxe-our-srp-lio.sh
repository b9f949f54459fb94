# verbs-rxe-our-srp-lio: blockwire's SRP initiator, verbs build, on the
# kernel's rdma_rxe against LIO's ib_srpt (RDMA/CM port 5556): the
# verifying benchmark at QD 1 and 16, and a 4 MiB copy in and out.
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
for qd in 1 16; do
  for rw in randwrite randread; do
    timeout 90 $V bench --rdma-device rxe0 --verify --overwrite --rw $rw --qd $qd --time 2s --size 8MiB $U > /tmp/b.out 2>&1 || rc=1
    grep -E "IOPS=|verify|blockwire:" /tmp/b.out
    cat /tmp/b.out >> /tmp/vsrpi.log
    grep -q "verify: 0 mismatches" /tmp/b.out || { tail -5 /tmp/b.out; rc=1; }
  done
done
dd if=/dev/urandom of=/tmp/src bs=1M count=4 2>/dev/null
timeout 120 $V copy --rdma-device rxe0 /tmp/src $U 2>> /tmp/vsrpi.log || rc=1
timeout 120 $V read --rdma-device rxe0 $U --length 4MiB --out /tmp/back 2>> /tmp/vsrpi.log || rc=1
cmp /tmp/src /tmp/back && say "copy through ib_srpt over kernel rxe readback OK" || rc=1
if grep -E "level=(WARN|ERROR)" /tmp/vsrpi.log; then say "our initiator logged a warning"; rc=1; fi
[ $rc = 0 ] || { tail -20 /tmp/vsrpi.log; dmesg | grep -iE 'srp|rxe' | tail -12; }
echo 0 > $T/enable
exit $rc
