# linux-srp-siw-acl: a protected target over SRP (issue 20). Its ACL first
# names another SRP port: the kernel's ib_srp is rejected and no disk
# appears. Then a reload lists the port ib_srp used, with luns = ["0=1"]:
# ib_srp logs in and sees exactly one disk, the target's LUN 1 (32 MiB) as
# its LUN 0 — not LUN 0 (64 MiB) — and the I/O and ext4 checks run on it.
rdma_dev siw dummy || exit 1
modprobe ib_srp; modprobe sd_mod
ID=0011223344556677
acl() {
  cat > /tmp/srpacl.toml <<TOML
srp_listen = ["[::]:5555"]
srp_id_ext = "$ID"
[[target]]
name = "$IQN"
initiators = ["iqn.2026-11.org.example:only-this-one"]
[[target.acl]]
srp_initiator = "$1"
luns = ["0=1"]
[[target.lun]]
id = 0
size = "64MiB"
[[target.lun]]
id = 1
size = "32MiB"
TOML
}
acl 0x00000000000000aa0000000000000001
/lab/bin/blockwire serve --listen 127.0.0.1:3262 --config /tmp/srpacl.toml > /tmp/bws.log 2>&1 &
BW=$!
sleep 1
kill -0 $BW 2>/dev/null || { say "blockwire serve did not start"; cat /tmp/bws.log; exit 1; }
add() { echo "id_ext=$ID,ioc_guid=$ID,dest=[2001:db8::77:1]:5555,initiator_ext=0000000000000001" > /sys/class/infiniband_srp/srp-siw0-1/add_target; }
disks() { ls /sys/class/scsi_host/*/device/target*/*/block 2>/dev/null; }
rc=0
add && { say "add_target succeeded for a port the ACL does not list"; rc=1; }
sleep 1
[ -z "$(disks)" ] || { say "a disk appeared for an unlisted port: $(disks)"; rc=1; }
PORT=$(sed -n 's/.*srp: login rejected.* initiator=\(0x[0-9a-f]*\).*/\1/p' /tmp/bws.log | head -1)
[ -n "$PORT" ] || { say "no rejected login in the target's log"; cat /tmp/bws.log; exit 1; }
say "ib_srp refused as $PORT; listing it with luns = [\"0=1\"]"
acl $PORT
kill -HUP $BW; sleep 1
add || { say "add_target failed for the listed port"; rc=1; }
for i in $(seq 1 50); do DEV=$(disks | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
if [ -n "$DEV" ] && [ -b /dev/$DEV ]; then
  N=$(disks | wc -l); SZ=$(cat /sys/block/$DEV/size)
  say "SRP disks: $N, /dev/$DEV size $SZ sectors"
  [ "$N" = 1 ] || { say "ib_srp sees $N disks, want only its LUN"; rc=1; }
  [ "$SZ" = 65536 ] || { say "its LUN 0 is $SZ sectors, want 65536 (the target's LUN 1)"; rc=1; }
  io_test || rc=1
else
  say "no SRP block device for the listed port"; rc=1
fi
for p in /sys/class/srp_remote_ports/port-*; do [ -e $p/delete ] && echo 1 > $p/delete; done
sleep 1
kill $BW; wait $BW || rc=1
grep -E "level=ERROR" /tmp/bws.log && { say "the target logged errors"; rc=1; }
[ $rc = 0 ] || tail -30 /tmp/bws.log
exit $rc
