# verbs-siw-srp-cycles: verbs-rxe-srp-cycles on the kernel's siw0 (an IPv6
# destination, as ib_srp over iWARP needs).
rdma_dev siw dummy || exit 1
. /lab/lib-cycles.sh
ulimit -l unlimited   # siw counts registered memory against it, root too
ID=0011223344556677
rc=0
cycles_start siw0 --listen 127.0.0.1:3262 --srp-roce-listen [2001:db8::77:1]:5555 --srp-id-ext $ID --rdma-memory 64MiB || exit 1
srp_cycles siw0-1 "[2001:db8::77:1]:5555" $ID 100
cycles_stop
exit $rc
