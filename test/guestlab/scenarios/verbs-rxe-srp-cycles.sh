# verbs-rxe-srp-cycles: Linux's ib_srp logs in to blockwire's SRP port on
# the kernel's rxe, reads from the disk and has its remote port deleted,
# 100 times (lib-cycles.sh). Each login used to leave its queue pairs in
# RTS, with ~4 MiB registered, until blockwire exited (the channel ended
# on the peer's disconnect but never closed its queue pair); with 16 MiB
# of registered memory the 2nd login's failed set-up then crashed
# blockwire in rdma_reject on a freed id, and a command whose data could
# not be moved was never answered (the disk went offline). Now
# blockwire's queue pairs, registrations, goroutines and descriptors are
# back where they were, every login gets its disk and every command an
# answer, and blockwire stops when asked.
. /lab/lib-roce.sh
. /lab/lib-cycles.sh
roce_lab || exit 1
ID=0011223344556677
rc=0
cycles_start rxe0 --listen 127.0.0.1:3268 --srp-roce-listen $LADDR:5555 --srp-id-ext $ID --rdma-memory 64MiB || exit 1
srp_cycles rxe0-1 $LADDR:5555 $ID 100
cycles_stop
exit $rc
