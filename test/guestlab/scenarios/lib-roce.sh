# lib-roce.sh (sourced by the RoCE scenarios, not a scenario): Linux's
# rdma_rxe on a veth end in the initial namespace, blockwire's userspace
# RoCEv2 device in namespace "bw" on the other end — the kernel's rxe UDP
# socket owns port 4791 in the initial namespace, and rxe keeps traffic to
# one of its own GIDs inside the kernel, so the two sides need their own
# stacks. Sets LADDR (Linux, rxe0 on va) and BADDR (blockwire, vb in bw).
LADDR=169.254.78.1
BADDR=169.254.78.2
LADDR6=fd00:78::1   # IPv6 GIDs are the addresses themselves
BADDR6=fd00:78::2
IP=/usr/bin/ip   # iproute2's: the busybox shell would run its own applet for a bare "ip"
roce_lab() {
  if [ ! -e /run/netns/bw ]; then
    modprobe veth; modprobe rdma_rxe || return 1; modprobe ib_uverbs; modprobe rdma_ucm
    $IP netns add bw || return 1
    $IP link add va type veth peer name vb netns bw || return 1
    $IP addr add $LADDR/24 dev va; $IP -6 addr add $LADDR6/64 dev va nodad; $IP link set va up
    $IP -n bw addr add $BADDR/24 dev vb; $IP -n bw -6 addr add $BADDR6/64 dev vb nodad; $IP -n bw link set vb up; $IP -n bw link set lo up
    rdma link add rxe0 type rxe netdev va || { dmesg | tail -3; return 1; }
  fi
  # The GIDs (IPv4-mapped and IPv6) appear once the addresses are up.
  for i in $(seq 1 50); do
    G=$(cat /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null)
    echo "$G" | grep -q "0000:0000:0000:0000:0000:ffff:a9fe:4e01" && echo "$G" | grep -q "fd00:0078:0000:0000:0000:0000:0000:0001" && break
    sleep 0.1
  done
  rdma link show | grep rxe0
}
BW="$IP netns exec bw"   # run a command in blockwire's namespace: $BW cmd...
# cap_start NAME / cap_end RC: capture the RoCEv2 traffic on va; when RC
# is not 0, print it on the console (gzip + base64 between
# =====PCAP-BEGIN NAME and =====PCAP-END lines) for tshark on the host.
cap_start() {
  CAPNAME=$1
  rm -f /tmp/cap.pcap
  tcpdump -i va -Z root -U -s 0 -w /tmp/cap.pcap udp port 4791 > /dev/null 2>&1 &
  CAP=$!
  sleep 1
}
cap_end() {
  kill -INT $CAP 2>/dev/null; wait $CAP 2>/dev/null
  [ "$1" = 0 ] && return
  dmesg -n 1
  echo "=====PCAP-BEGIN $CAPNAME"; gzip -c /tmp/cap.pcap | base64; echo "=====PCAP-END"
}
