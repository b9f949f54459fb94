# verbs-siw-our-iser-lio: blockwire's iSER initiator, verbs build, on the
# kernel's siw against LIO's ib_isert on the same device: the verifying
# benchmark (random writes and reads, QD 1 and 8) and a 4 MiB copy in and
# out. On iWARP the RDMA/CM listener is a kernel TCP listener, and LIO puts
# its iSCSI/TCP portal on the same address and port before isert listens
# (rdma_listen fails with EADDRINUSE, shared/spec/guestlab.md). LIO opens
# that TCP socket in the network namespace of the process that creates the
# portal, while isert listens in the initial one: the portal is created
# from namespace "lio", which has the same address on a dummy link, and
# the RDMA/CM listener on siw0 is left alone.
. /lab/lib-io.sh
rdma_dev siw dummy || exit 1
ulimit -l unlimited   # siw counts registered memory against it, root too
modprobe target_core_mod && modprobe iscsi_target_mod && modprobe ib_isert || exit 1
IP=/usr/bin/ip
[ -e /run/netns/lio ] || { $IP netns add lio && $IP -n lio link add lio0 type dummy && $IP -n lio addr add $RADDR/24 dev lio0 && $IP -n lio link set lio0 up; } || exit 1
if [ ! -d $CFG/core/rd_mcp_0/rd0 ]; then mkdir -p $CFG/core/rd_mcp_0/rd0; echo rd_pages=16384 > $CFG/core/rd_mcp_0/rd0/control; echo 1 > $CFG/core/rd_mcp_0/rd0/enable; fi
T=$CFG/iscsi/$IQN/tpgt_1
mkdir -p $T/lun/lun_0; [ -e $T/lun/lun_0/rd0 ] || ln -s $CFG/core/rd_mcp_0/rd0 $T/lun/lun_0/rd0
NP=$T/np/$RADDR:3262
nsenter --net=/run/netns/lio mkdir $NP || { say "no LIO portal from namespace lio"; exit 1; }
echo 1 > $NP/iser || { dmesg | tail -5; exit 1; }
say "LIO isert listening on siw0 at $RADDR:3262 (its TCP portal in namespace lio)"
echo 0 > $T/attrib/authentication; echo 1 > $T/attrib/generate_node_acls
echo 1 > $T/attrib/cache_dynamic_acls; echo 0 > $T/attrib/demo_mode_write_protect
echo 1 > $T/enable
U=iser://$RADDR:3262/$IQN/0
rm -f /tmp/src /tmp/back /tmp/visi.log /tmp/pat /tmp/rb
rc=0
bench_copy /tmp/visi.log "1 8" 2s 8MiB /lab/bin/blockwire-verbs "--log-level info --rdma-windows --rdma-device siw0" && say "copy through LIO isert over kernel siw readback OK" || rc=1
grep -q "one key (no memory windows" /tmp/visi.log && say "siw0 has no memory windows: one key per chunk" || { say "no word of siw0's keys"; rc=1; }
[ $rc = 0 ] || { tail -20 /tmp/visi.log; dmesg | grep -iE 'isert|siw|iw_' | grep -v "speed is" | tail -15; }
echo 0 > $T/enable
rmdir $NP 2>/dev/null || { echo 0 > $NP/iser; rmdir $NP; }
exit $rc
