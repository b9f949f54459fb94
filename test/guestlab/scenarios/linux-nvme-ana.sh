# linux-nvme-ana: blockwire serves its default LUN over NVMe/TCP on two
# portals of their own (4430, 4431) with ALUA on (--port-groups), and over
# iSCSI; the guest's
# nvme-tcp host connects both portals: Linux native multipath makes one
# namespace of two paths, each reporting ANA "optimized". While a 32 MiB
# pattern is written through the multipath device, sg_stpg (through an
# open-iscsi session) puts this gateway's group in standby: both NVMe
# paths turn "inaccessible" (ANA change notices), the writes wait instead
# of failing; back to optimized, they finish — no I/O error reaches the
# application, and the pattern reads back. Sourced by /lab/run.sh.
H=nqn.2014-08.org.nvmexpress:uuid:5eb1f0a7-0000-4000-8000-000000000002
NQN=nqn.2026-11.io.blockwire:$IQN
/lab/bin/blockwire serve --listen 127.0.0.1:3264 --nvme-listen 127.0.0.1:4430 --nvme-listen 127.0.0.1:4431 --iqn $IQN --size 64MiB \
  --iser=false --tpgt 1 --port-groups 1=ao,2=ano > /tmp/bwana.log 2>&1 &
BW=$!
sleep 1
modprobe nvme_tcp || exit 1
rc=0
states() { for p in /sys/block/nvme*c*n1; do [ -e $p/ana_state ] && echo "$(basename $p)=$(cat $p/ana_state)"; done | tr '\n' ' '; }
for port in 4430 4431; do nvme connect -t tcp -a 127.0.0.1 -s $port -n $NQN --hostnqn $H || rc=1; done
for i in $(seq 1 50); do HEAD=$(ls /sys/block | grep -E '^nvme[0-9]+n1$' | head -1); [ -n "$HEAD" ] && [ -b /dev/$HEAD ] && break; sleep 0.2; done
# The second path's block node may come a moment after the head's.
for i in $(seq 1 50); do NPATHS=$(ls -d /sys/block/nvme*c*n1 2>/dev/null | wc -l); [ "$NPATHS" = 2 ] && break; sleep 0.2; done
say "multipath device /dev/$HEAD, $NPATHS paths: $(states)"
[ "$NPATHS" = 2 ] || { say "not two paths"; rc=1; }
[ "$(states | grep -o optimized | wc -l)" = 2 ] || { say "the paths are not both optimized"; rc=1; }
iscsid_up && iscsi_login default 3264 || rc=1
dd if=/dev/urandom of=/tmp/pat bs=1M count=32 2>/dev/null
( dd if=/tmp/pat of=/dev/$HEAD bs=64k oflag=direct 2>/tmp/dd.err; echo $? > /tmp/dd.rc ) &
DD=$!
sleep 0.3
sg_stpg --standby --tp=1 /dev/$DEV || { say "sg_stpg failed"; rc=1; }
for i in $(seq 1 50); do [ "$(states | grep -o inaccessible | wc -l)" = 2 ] && break; sleep 0.2; done
say "after sg_stpg --standby: $(states)"
[ "$(states | grep -o inaccessible | wc -l)" = 2 ] || { say "the paths did not turn inaccessible"; rc=1; }
sleep 1
sg_stpg --optimized --tp=1 /dev/$DEV || { say "sg_stpg back failed"; rc=1; }
for i in $(seq 1 50); do [ "$(states | grep -o optimized | wc -l)" = 2 ] && break; sleep 0.2; done
say "after sg_stpg --optimized: $(states)"
wait $DD
[ "$(cat /tmp/dd.rc)" = 0 ] && say "the writes across the state change all succeeded" || { cat /tmp/dd.err; say "an I/O error reached dd"; rc=1; }
dd if=/dev/$HEAD of=/tmp/back bs=1M count=32 iflag=direct 2>/dev/null
cmp /tmp/pat /tmp/back && say "the pattern reads back" || { say "the pattern differs"; rc=1; }
dmesg | grep -iE 'nvme|ana' | tail -6
nvme disconnect -n $NQN >/dev/null || rc=1
logout_all
kill $BW; wait $BW || rc=1
[ $rc = 0 ] || tail -20 /tmp/bwana.log
exit $rc
