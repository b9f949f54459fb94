# verbs-rxe-iser-cycles: Linux's ib_iser logs in to blockwire's verbs build
# on the kernel's rxe0, reads 1 MiB and logs out, 100 times after three
# that warm it up: blockwire's queue pairs (rdma res) and descriptors are
# back where they were, its registered memory within 16 MiB (its buffer
# pool may grow a few chunks), its goroutines within 8, and it stops cleanly
# (lib-cycles.sh).
. /lab/lib-roce.sh
. /lab/lib-cycles.sh
roce_lab || exit 1
modprobe ib_iser
rc=0
cycles_start rxe0 --listen $LADDR:3260 --roce-listen $LADDR:3260 || exit 1
iser_cycles $LADDR 3260 100
cycles_stop
exit $rc
