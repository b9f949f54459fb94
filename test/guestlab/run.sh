#!/bin/sh
# guestlab test library: sh /lab/run.sh <test>
CFG=/sys/kernel/config/target
IQN=iqn.2003-01.org.linux-iscsi.guestlab:t1
up() { cut -d' ' -f1 /proc/uptime; }
say() { echo "LAB[$(up)]: $*"; }

# RDMA soft device: $1=siw|rxe, $2=lo|dummy.  lo: device on lo, address 127.0.0.1.
# dummy: dummy0 with link-local 169.254.77.1/24 inside the NIC-less guest (rdma_cm treats every 127/8 dst as
# "loopback" and binds the first RDMA device without a netdev, which breaks RoCE route resolution).
RADDR=127.0.0.1
rdma_dev() {
  nd=${2:-lo}
  if [ "$nd" = dummy ]; then
    [ -e /sys/class/net/dummy0 ] || { modprobe dummy; ip link add dummy0 type dummy 2>/dev/null; ip addr add 169.254.77.1/24 dev dummy0; ip -6 addr add 2001:db8::77:1/64 dev dummy0; ip link set dummy0 up; }
    RADDR=169.254.77.1; nd=dummy0
  fi
  if [ "$1" = siw ]; then modprobe siw || return 1; else modprobe rdma_rxe || return 1; fi
  modprobe ib_uverbs; modprobe rdma_ucm
  [ -e /sys/class/infiniband/${1}0 ] || rdma link add ${1}0 type $1 netdev $nd || { dmesg | tail -3; return 1; }
  rdma link show; ibv_devices
  grep -v "0000:0000:0000:0000:0000:0000:0000:0000" /sys/class/infiniband/${1}0/ports/1/gids/* 2>/dev/null; true
}
rping_test() { # userspace verbs + rdma_cm ping
  timeout 20 rping -s -a $RADDR -p 7471 -C 3 & sp=$!; sleep 1
  timeout 20 rping -c -a $RADDR -p 7471 -C 3 -v; rc=$?; wait $sp; return $rc
}
lio_target() { # ramdisk 64MiB LUN, iSCSI portal ${2:-127.0.0.1}:${1:-3260}, demo mode (no ACL/CHAP)
  port=${1:-3260}; addr=${2:-127.0.0.1}
  modprobe target_core_mod && modprobe iscsi_target_mod || return 1
  if [ ! -d $CFG/core/rd_mcp_0/rd0 ]; then
    mkdir -p $CFG/core/rd_mcp_0/rd0
    echo rd_pages=16384 > $CFG/core/rd_mcp_0/rd0/control
    echo 1 > $CFG/core/rd_mcp_0/rd0/enable
  fi
  T=$CFG/iscsi/$IQN/tpgt_1
  mkdir -p $T/lun/lun_0
  [ -e $T/lun/lun_0/rd0 ] || ln -s $CFG/core/rd_mcp_0/rd0 $T/lun/lun_0/rd0
  mkdir -p $T/np/$addr:$port || return 1
  echo 0 > $T/attrib/authentication; echo 1 > $T/attrib/generate_node_acls
  echo 1 > $T/attrib/cache_dynamic_acls; echo 0 > $T/attrib/demo_mode_write_protect
  echo 1 > $T/enable
  say "LIO target $IQN on $addr:$port"
}
iscsid_up() {
  modprobe sd_mod; modprobe iscsi_tcp
  pidof iscsid >/dev/null || iscsid || return 1; sleep 1
}
iscsi_login() { # $1 = iface (default|iser), $2 = port, $3 = addr
  iface=${1:-default}; port=${2:-3260}; addr=${3:-127.0.0.1}
  iscsiadm -m discovery -t st -p $addr:$port -I $iface || return 1
  iscsiadm -m node -T $IQN -p $addr:$port -I $iface --login || return 1
  iscsiadm -m session -P 1 | grep -E 'Target|Iface Transport|Current Portal|iSCSI Session State'
  for i in $(seq 1 50); do DEV=$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && [ -b /dev/$DEV ] && break; sleep 0.2; done
  [ -b /dev/$DEV ] || { say "no block device"; return 1; }
  say "block device /dev/$DEV size $(cat /sys/block/$DEV/size) sectors"
}
io_test() { # dd pattern write/readback with O_DIRECT, then mkfs.ext4 + mount + file check
  d=/dev/$DEV
  dd if=/dev/urandom of=/tmp/pat bs=1M count=16 2>/dev/null
  dd if=/tmp/pat of=$d bs=1M oflag=direct 2>&1 | tail -1
  dd if=$d of=/tmp/rb bs=1M count=16 iflag=direct 2>&1 | tail -1
  cmp /tmp/pat /tmp/rb && say "dd pattern readback OK" || { say "dd readback MISMATCH"; return 1; }
  mkfs.ext4 -q -F $d || return 1
  modprobe ext4; mount -t ext4 $d /mnt || return 1
  cp /tmp/pat /mnt/pat; sync; umount /mnt; echo 3 > /proc/sys/vm/drop_caches
  mount -t ext4 $d /mnt && cmp /tmp/pat /mnt/pat && say "ext4 file readback OK"; rc=$?
  umount /mnt; return $rc
}
logout_all() { iscsiadm -m node -u >/dev/null 2>&1; iscsiadm -m node -o delete >/dev/null 2>&1; }

case "$1" in
  siw|rxe|siw@*|rxe@*) rdma_dev ${1%@*} $(echo $1 | sed -n 's/.*@//p') && rping_test ;;
  tcp) lio_target 3260 && iscsid_up && iscsi_login default 3260 && io_test; rc=$?; logout_all; exit $rc ;;
  iser-siw|iser-rxe)   # LIO ib_isert target + open-iscsi/ib_iser initiator over soft RDMA on dummy0
    dev=${1#iser-}; rdma_dev $dev dummy || exit 1
    modprobe ib_isert; modprobe ib_iser
    lio_target 3260 $RADDR || exit 1
    NP=$CFG/iscsi/$IQN/tpgt_1/np/$RADDR:3260
    echo 1 > $NP/iser || { dmesg | tail -5; exit 1; }
    say "iser enabled on np $RADDR:3260: $(cat $NP/iser)"
    iscsid_up && iscsi_login iser 3260 $RADDR && iscsiadm -m session -P 3 | grep -iE 'transport|MaxRecv|FirstBurst|ImmediateData' && io_test; rc=$?
    dmesg | grep -iE 'iser|isert' | tail -8; logout_all; exit $rc ;;
  srp-siw|srp-rxe)   # LIO ib_srpt target + ib_srp initiator, both via rdma_cm (no IB CM / SM needed)
    dev=${1#srp-}; rdma_dev $dev dummy || exit 1
    modprobe target_core_mod; modprobe ib_srpt; modprobe ib_srp; modprobe sd_mod
    mkdir -p $CFG/srpt; echo 5555 > $CFG/srpt/discovery_auth/rdma_cm_port || exit 1
    if [ ! -d $CFG/core/rd_mcp_0/rd0 ]; then mkdir -p $CFG/core/rd_mcp_0/rd0; echo rd_pages=16384 > $CFG/core/rd_mcp_0/rd0/control; echo 1 > $CFG/core/rd_mcp_0/rd0/enable; fi
    GID=$(cat /sys/class/infiniband/${dev}0/ports/1/gids/0 | tr -d :)
    IID=$(echo $GID | cut -c17-32); IIDC=$(echo $IID | sed 's/\(....\)\(....\)\(....\)\(....\)/\1:\2:\3:\4/')
    for P in $IIDC 0x$GID; do mkdir $CFG/srpt/$P 2>/dev/null && { say "srpt port $P created"; break; }; say "srpt port name $P rejected"; done
    T=$CFG/srpt/$P/tpgt_1 ; [ -d $T ] || mkdir $T || exit 1
    mkdir -p $T/lun/lun_0; ln -s $CFG/core/rd_mcp_0/rd0 $T/lun/lun_0/rd0
    # dest must be IPv6: srpt listens on [::]:port; siw (iWARP) then only accepts IPv6 (rxe takes either)
    SDEST=[2001:db8::77:1]:5555
    # ACL names: srpt names an rdma_cm session by "%pIS" of the address (IPv6 fully expanded)
    for a in $RADDR 2001:0db8:0000:0000:0000:0000:0077:0001 0x0000000000000000$IID; do mkdir -p $T/acls/$a/lun_0 && ln -s $T/lun/lun_0 $T/acls/$a/lun_0/map; done
    echo 1 > $T/enable; ls $CFG/srpt $T/acls; ls /sys/class/infiniband_srp/
    NG=$(cat /sys/class/infiniband/${dev}0/node_guid | tr -d :)   # srpt checks t_port_id == node GUID (srpt_service_guid)
    echo "id_ext=$NG,ioc_guid=$NG,dest=$SDEST,initiator_ext=0000000000000000" > /sys/class/infiniband_srp/srp-${dev}0-1/add_target; rc=$?
    say "add_target rc=$rc"; sleep 1; dmesg | grep -iE "srp|siw|iw_|rdma" | grep -v "speed is" | tail -12
    for i in $(seq 1 25); do DEV=$(ls /sys/class/scsi_host/*/device/target*/*/block 2>/dev/null | head -1); [ -n "$DEV" ] && break; sleep 0.2; done
    [ -n "$DEV" ] || { say "no SRP block device"; exit 1; }
    say "SRP block device /dev/$DEV ($(cat /sys/class/scsi_host/*/proc_name 2>/dev/null | tr '\n' ' '))"; io_test ;;
  /*) . "$1" ;;   # project hook: a script (e.g. from an appended cpio) sourced with these helpers
  *) echo "unknown test $1"; exit 2 ;;
esac
