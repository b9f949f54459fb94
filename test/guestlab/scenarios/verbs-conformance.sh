# verbs-conformance: the Datamover Interface's conformance suite
# (datamover/dmtest, which fabric's TestDatamoversConform runs on every
# datamover) on the kernel's RDMA devices through rdma-core — rxe0 and a
# siw device — each suite connection's target and initiator on one device,
# as the host's CI cannot (it has no RDMA modules).
. /lab/lib-io.sh
. /lab/lib-roce.sh
roce_lab || exit 1
modprobe siw; modprobe dummy
SADDR=169.254.79.1
$IP link add dmsiw type dummy && $IP addr add $SADDR/24 dev dmsiw && $IP link set dmsiw up || exit 1
rdma link add siw_dm type siw netdev dmsiw || { dmesg | tail -3; exit 1; }
ulimit -l unlimited   # siw counts registered memory against RLIMIT_MEMLOCK, root too
rc=0
BLOCKWIRE_DMTEST_VERBS="rxe0=$LADDR:3270 siw_dm=$SADDR:3271" /lab/bin/fabric-verbs.test \
  -test.run '^TestDatamoversConform$/^ISERoverVerbs$' -test.v -test.timeout 5m > /tmp/dm.log 2>&1 || rc=1
for dev in rxe0 siw_dm; do
  n=$(grep -c -- "--- PASS: TestDatamoversConform/ISERoverVerbs/$dev/" /tmp/dm.log)
  grep -q -- "--- PASS: TestDatamoversConform/ISERoverVerbs/$dev " /tmp/dm.log && say "conformance suite on $dev: $n cases passed" || { say "conformance suite on $dev did not pass"; rc=1; }
done
grep -q -- "--- SKIP" /tmp/dm.log && { say "a case skipped: $(grep -- '--- SKIP' /tmp/dm.log | head -3)"; rc=1; }
[ $rc = 0 ] || { grep -E -- "--- FAIL|_test.go:[0-9]+:" /tmp/dm.log | head -30; tail -20 /tmp/dm.log; dmesg | tail -5; }
exit $rc
