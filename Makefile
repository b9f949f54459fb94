# Conveniences; the README's commands work without make.
.PHONY: test test-long bench bench-file bench-spdk bench-nvme bench-roce fuzz guestlab guestlab-bench deb

test:
	go run ./internal/testsum -race ./...

# With the long runs the README's command skips: torture, real peers.
test-long:
	BLOCKWIRE_LONG=1 go run ./internal/testsum -race -timeout 20m ./...

# Side-by-side with tgt (needs root and: apt-get install tgt qemu-utils
# qemu-block-extra libiscsi-bin iperf3).
bench:
	go run ./bench -rounds 3

# File LUNs (pread, io_uring, O_DIRECT) against fio on the same file, in
# tmpfs and on a loop device (apt-get install fio; root for the loop).
bench-file:
	go run ./bench -file -rounds 3

# Per target core against SPDK's iscsi_tgt and tgt, pinned (SPDK built as
# ../shared/anchors/spdk/README.md says; the harness tells how if not).
bench-spdk:
	go run ./bench -spdk -rounds 3
	go run ./bench -spdk -pin=false -rounds 3

# NVMe/TCP per target core against SPDK's nvmf_tgt, spdk_nvme_perf the
# client of both (SPDK built as for bench-spdk).
bench-nvme:
	go run ./bench -nvme -conns -rounds 3

# iSER over the software RoCEv2 device against iSCSI/TCP on one target
# (root, for the raw socket that checks each ICRC over its real header).
bench-roce:
	go run ./bench -roce -rounds 3
	go run ./bench -roce -poll 50us -rounds 3

# A longer fuzzing pass: FUZZTIME per target (default 2m).
FUZZTIME ?= 2m
fuzz:
	FUZZTIME=$(FUZZTIME) .ci/fuzz

# The Linux kernel's initiators and targets as peers, in QEMU (root,
# Debian apt; the image is cached in /var/tmp/blockwire-guestlab).
guestlab:
	go test -tags guestlab -count=1 -v ./test/guestlab

# The guest lab's benchmarks: blockwire's verbs build on kernel rxe against
# LIO isert on kernel rxe, the same Linux initiator (docs/bench/journal.md).
guestlab-bench:
	BLOCKWIRE_GUESTLAB_BENCH=1 go test -tags guestlab -count=1 -v -timeout 30m ./test/guestlab

# The Debian package: dist/blockwire_*.deb (packaging/deb.sh, nfpm).
deb:
	packaging/deb.sh
