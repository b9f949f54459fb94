# verbs-siw-iser-cycles: verbs-rxe-iser-cycles on the kernel's siw0 (iWARP:
# the iSER portal on 3261, beside iSCSI/TCP on 3260).
rdma_dev siw dummy || exit 1
modprobe ib_iser
. /lab/lib-cycles.sh
ulimit -l unlimited
rc=0
cycles_start siw0 --listen $RADDR:3260 --roce-listen $RADDR:3261 || exit 1
iser_cycles $RADDR 3261 100
cycles_stop
exit $rc
