# linux-sg3-utils: the SCSI features hypervisors and cluster validators
# look for, through the kernel's open-iscsi and sd, checked with
# sg3-utils (nobody here wrote either): standard INQUIRY with 3PC and
# TPGS 11b, the third-party copy VPD page (8Fh) decoded by sg_vpd;
# sg_persist REGISTER with SPEC_I_PT naming a second initiator port (two
# I_T nexuses registered at once, both in READ FULL STATUS); sg_stpg
# putting this gateway's port group in standby and the other's active
# (sg_rtpg reports both, set explicitly; I/O is refused in standby), and
# back.
/lab/bin/blockwire serve --listen 127.0.0.1:3260 --iqn $IQN --size 64MiB --iser=false --tpgt 1 --port-groups 1=ao,2=ano > /tmp/bwsg.log 2>&1 &
BW=$!
sleep 1
rc=0
iscsid_up && iscsi_login default 3260 || { tail -20 /tmp/bwsg.log; exit 1; }
D=/dev/$DEV
sg_inq $D > /tmp/inq.txt 2>&1 || rc=1
grep -E "3PC=1" /tmp/inq.txt >/dev/null && grep -E "TPGS=3" /tmp/inq.txt >/dev/null && say "sg_inq: $(grep -oE '(3PC|TPGS)=[0-9]' /tmp/inq.txt | tr '\n' ' ')" || { say "sg_inq lacks 3PC=1 or TPGS=3"; cat /tmp/inq.txt; rc=1; }
sg_vpd --page=tpc $D > /tmp/tpc.txt 2>&1 || { cat /tmp/tpc.txt; rc=1; }
cat /tmp/tpc.txt | head -40
grep -qi "supported commands" /tmp/tpc.txt && grep -qi "parameter data" /tmp/tpc.txt && grep -qi "general copy" /tmp/tpc.txt && say "sg_vpd decodes the third-party copy page" || { say "sg_vpd: third-party copy page not decoded"; rc=1; }
# SPEC_I_PT: register this nexus and a second initiator port at once
# (sg_persist sets SPEC_I_PT when REGISTER is given a TransportID).
ME=$(cat /sys/class/iscsi_session/session*/initiatorname)
OTHER="iqn.2004-10.org.guestlab:other,i,0x23d000000001"
sg_persist --out --register --param-sark=0xabc --transport-id="$OTHER" $D || { say "sg_persist SPEC_I_PT failed"; rc=1; }
sg_persist --in --read-full-status $D > /tmp/fs.txt 2>&1
cat /tmp/fs.txt
n=$(grep -c "Key=0xabc" /tmp/fs.txt)
[ "$n" = 2 ] && grep -q "guestlab:other" /tmp/fs.txt && grep -q "$ME" /tmp/fs.txt && say "SPEC_I_PT registered two I_T nexuses at once" || { say "READ FULL STATUS shows $n registrations"; rc=1; }
sg_persist --in --report-capabilities $D | grep -iE "SIP_C|Specify initiator" | head -2
sg_persist --out --register --param-rk=0xabc --param-sark=0 $D || rc=1
# Explicit ALUA: this gateway (port 1) to standby, the other to active.
sg_rtpg --decode $D | grep -E "target port group|asymmetric|status" | head -6
sg_stpg --standby --tp=1 $D && sg_stpg --optimized --tp=2 $D || { say "sg_stpg failed"; rc=1; }
sg_rtpg --decode $D > /tmp/rtpg.txt 2>&1; cat /tmp/rtpg.txt
grep -A2 "target port group id : 0x1" /tmp/rtpg.txt | grep -qi "standby" && grep -A2 "target port group id : 0x2" /tmp/rtpg.txt | grep -qi "active/optimized" &&
  grep -qi "SET TARGET PORT GROUPS" /tmp/rtpg.txt && say "sg_stpg: group 1 standby, group 2 active/optimized, set explicitly" || { say "sg_rtpg does not show the new states"; rc=1; }
dd if=$D of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null && { say "a read through a port in standby succeeded"; rc=1; } || say "a read through the port in standby is refused"
sg_stpg --optimized --tp=1 $D && sg_stpg --active --tp=2 $D || rc=1
dd if=$D of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null && say "back to active/optimized: reads work" || rc=1
grep "SET TARGET PORT GROUPS" /tmp/bwsg.log | head -2
logout_all
kill $BW; wait $BW || rc=1
[ $rc = 0 ] || tail -30 /tmp/bwsg.log
exit $rc
