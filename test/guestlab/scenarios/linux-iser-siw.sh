# linux-iser-siw: blockwire serves iSER (connection-first, its userspace
# iWARP device) on the guest's dummy0 address; the kernel's ib_iser, over
# the kernel's soft-iWARP (siw), discovers and logs in through open-iscsi's
# iser interface; then the I/O and ext4 checks of linux-initiator-tcp. Linux
# siw talks to our MPA/DDP/RDMAP and Linux ib_iser to our iSER target.
rdma_dev siw dummy || exit 1
modprobe ib_iser
/lab/bin/blockwire serve --listen $RADDR:3260 --iqn $IQN --size 64MiB > /tmp/bw.log 2>&1 &
BW=$!
sleep 1
rc=1
if iscsid_up && iscsi_login iser 3260 $RADDR; then
  iscsiadm -m session -P 3 | grep -iE 'transport|MaxRecv|FirstBurst|ImmediateData'
  io_test; rc=$?
  grep -q 'remote=iser:' /tmp/bw.log || { say "the session did not use iSER"; rc=1; }
fi
dmesg | grep -iE 'iser|siw' | grep -v "speed is" | tail -8
logout_all
kill $BW; wait $BW || rc=1
[ $rc = 0 ] || tail -40 /tmp/bw.log
exit $rc
