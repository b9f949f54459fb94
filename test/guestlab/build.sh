#!/bin/bash
# Build the guestlab (Debian 6.1 kernel + busybox initramfs with open-iscsi, LIO, rdma_rxe, siw, ib_iser/isert, ib_srp/srpt,
# nvme-tcp and nvmet-tcp,
# dm-log-writes for the power cut).
# usage: build-guestlab.sh OUTDIR   (needs root + Debian bookworm apt; init and run.sh beside this script)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); L=${1:-./guestlab-out}; mkdir -p "$L"; cd "$L"
T0=$(date +%s); t() { echo "[guestlab] $* at +$(( $(date +%s)-T0 ))s"; }
apt-get update -q >/dev/null
KPKG=$(apt-cache show linux-image-amd64 | sed -n 's/^Depends: \(linux-image-[^ ]*\) .*/\1/p' | sed -n 1p)   # e.g. linux-image-6.1.0-56-amd64
KV=${KPKG#linux-image-}; KSRC=linux-source-$(echo "$KV" | cut -d. -f1,2)                             # 6.1.0-56-amd64, linux-source-6.1
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  qemu-system-x86 busybox-static cpio zstd kmod xz-utils gcc make "linux-headers-$KV" >/dev/null
t "host packages ($KPKG)"
PKGS="libc6 libgcc-s1 open-iscsi libopeniscsiusr libisns0 libkmod2 libmount1 libblkid1 libselinux1 libpcre2-8-0 libssl3
 libsystemd0 libcap2 libgcrypt20 libgpg-error0 liblz4-1 liblzma5 libzstd1 zlib1g iproute2 libbpf1 libbsd0 libmd0 libdb5.3
 libelf1 libmnl0 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libxtables12 e2fsprogs
 libext2fs2 libcom-err2 libss2 libuuid1 kmod rdmacm-utils ibverbs-utils libibverbs1 librdmacm1 ibverbs-providers
 libnl-3-200 libnl-route-3-200 busybox-static dmsetup libdevmapper1.02.1 libudev1"
mkdir -p debs; (cd debs && apt-get download $PKGS "$KPKG" "$KSRC" 2>&1 | { grep -v unsandboxed || true; } | tail -1)
t "downloads"
# kernel
rm -rf kernel; dpkg-deb -x debs/${KPKG}_*.deb kernel; cp kernel/boot/vmlinuz-$KV vmlinuz
# siw (soft-iWARP) is not enabled in Debian's kernels: build it out of tree from Debian's own source
rm -rf siwsrc; mkdir siwsrc
dpkg-deb --fsys-tarfile debs/${KSRC}_*.deb | tar -xO "./usr/src/$KSRC.tar.xz" | xz -dc -T2 \
  | tar -x -C siwsrc --strip-components=1 --wildcards "$KSRC/drivers/infiniband/sw/siw/*"
make -s -C /lib/modules/$KV/build M=$L/siwsrc/drivers/infiniband/sw/siw CONFIG_RDMA_SIW=m modules -j2
t "siw built"
# root: usrmerged skeleton + whole packages
rm -rf root; mkdir -p root/usr/{bin,sbin,lib,lib64}; for d in bin sbin lib lib64; do ln -s usr/$d root/$d; done
for d in debs/*.deb; do case $d in *linux-image*|*linux-source*) continue;; esac
  dpkg-deb --fsys-tarfile "$d" | tar -x --keep-directory-symlink -C root; done
rm -rf root/usr/share/{doc,man,info,locale,lintian,bug}
ln -sf busybox root/usr/bin/sh
# modules: closure of what the lab needs (+ siw), then depmod
SRC=kernel/lib/modules/$KV; D=root/lib/modules/$KV; mkdir -p $D/extra; cp $SRC/modules.builtin* $SRC/modules.order $D/
declare -A seen
addmod() { local m=$1 f d; [ -n "${seen[$m]:-}" ] && return 0; seen[$m]=1
  f=$(find $SRC/kernel \( -name "$m.ko" -o -name "${m//_/-}.ko" -o -name "${m//-/_}.ko" \) -print -quit)
  [ -z "$f" ] && return 0
  mkdir -p $D/$(dirname ${f#$SRC/}); cp $f $D/${f#$SRC/}
  for d in $(modinfo -F depends $f | tr , ' '); do addmod $d; done
  for d in $(modinfo -F softdep $f | tr ' ' '\n' | grep -v :); do addmod $d; done; }
for m in scsi_mod sd_mod sg iscsi_tcp ib_iser rdma_rxe ib_srp ib_srpt ib_isert target_core_mod target_core_file \
  target_core_iblock iscsi_target_mod ib_uverbs rdma_ucm ib_umad ext4 dummy veth sch_netem loop configfs crc32c_generic \
  scsi_debug dm_mod dm_log_writes nvme_tcp nvme_fabrics nvme_core nvmet nvmet_tcp crc32c-intel crct10dif_generic crct10dif-pclmul libcrc32c crc64_rocksoft_generic crc32_generic crc32-pclmul; do addmod $m; done
strip --strip-debug -o $D/extra/siw.ko siwsrc/drivers/infiniband/sw/siw/siw.ko
depmod -b root $KV
# config files + lab scripts
mkdir -p root/lab root/etc
echo 'root:x:0:0:root:/root:/bin/sh' > root/etc/passwd; echo 'root:x:0:' > root/etc/group   # iscsid needs uid 0 -> name
printf 'passwd: files\ngroup: files\nhosts: files\n' > root/etc/nsswitch.conf; echo '127.0.0.1 localhost guestlab' > root/etc/hosts
install -m755 "$HERE/init" root/init; install -m755 "$HERE/run.sh" root/lab/run.sh
(cd root && find . -print0 | cpio --null -o -H newc --quiet) | zstd -q -T2 -10 > initrd.img
t "initrd.img $(du -h initrd.img | cut -f1) (root $(du -sh root | cut -f1))"
