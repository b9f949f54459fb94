# our-nvme-host-nvmet: Linux nvmet-tcp (the kernel's NVMe-oF target,
# configfs) serves a 64 MiB file as namespace 1 of a subsystem on
# 127.0.0.1:4421; blockwire's NVMe/TCP host discovers it, runs its
# verifying benchmark (random writes and reads at QD 1 and 16) and copies
# 4 MiB in and out — without digests, then with header and data digests.
# Sourced by /lab/run.sh (bench_copy from lib-io.sh).
. /lab/lib-io.sh
NQN=nqn.2026-11.io.blockwire:nvmet-peer
N=/sys/kernel/config/nvmet
modprobe nvmet && modprobe nvmet_tcp || { say "no nvmet modules"; exit 1; }
head -c 67108864 /dev/zero > /tmp/nvmet.img
mkdir $N/subsystems/$NQN && echo 1 > $N/subsystems/$NQN/attr_allow_any_host || exit 1
mkdir $N/subsystems/$NQN/namespaces/1
echo -n /tmp/nvmet.img > $N/subsystems/$NQN/namespaces/1/device_path
echo 1 > $N/subsystems/$NQN/namespaces/1/buffered_io
echo 1 > $N/subsystems/$NQN/namespaces/1/enable || { dmesg | tail -3; exit 1; }
mkdir $N/ports/1
echo tcp > $N/ports/1/addr_trtype; echo ipv4 > $N/ports/1/addr_adrfam
echo 127.0.0.1 > $N/ports/1/addr_traddr; echo 4421 > $N/ports/1/addr_trsvcid
ln -s $N/subsystems/$NQN $N/ports/1/subsystems/$NQN || exit 1
rc=0
/lab/bin/blockwire discover nvme+tcp://127.0.0.1:4421 > /tmp/disc.out 2>&1 || rc=1
cat /tmp/disc.out
grep -q "127.0.0.1:4421 $NQN" /tmp/disc.out || { say "our discover does not list nvmet's subsystem"; rc=1; }
U=nvme+tcp://127.0.0.1:4421/$NQN/1
bench_copy /tmp/h.log "1 16" 3s 16MiB /lab/bin/blockwire && say "our host against nvmet-tcp: bench and copy OK" || rc=1
bench_copy /tmp/hd.log "16" 3s 16MiB /lab/bin/blockwire "--header-digest --data-digest" && say "with digests: bench and copy OK" || rc=1
dmesg | grep -i nvmet | tail -4
# Leave nothing for the next scenario: nvmet's port, subsystem, namespace.
rm $N/ports/1/subsystems/$NQN && rmdir $N/ports/1 || rc=1
echo 0 > $N/subsystems/$NQN/namespaces/1/enable; rmdir $N/subsystems/$NQN/namespaces/1 && rmdir $N/subsystems/$NQN || rc=1
exit $rc
