# Conveniences; the README's commands work without make.
.PHONY: test bench fuzz guestlab guestlab-bench deb

test:
	go test -race ./...

# Side-by-side with tgt (needs root and: apt-get install tgt qemu-utils
# qemu-block-extra libiscsi-bin iperf3).
bench:
	go run ./bench -rounds 3

# A longer fuzzing pass: FUZZTIME per target (default 2m).
FUZZTIME ?= 2m
fuzz:
	FUZZTIME=$(FUZZTIME) .ci/fuzz

# The Linux kernel's initiators and targets as peers, in QEMU (root,
# Debian apt; the image is cached in /var/tmp/blockwire-guestlab).
guestlab:
	go test -tags guestlab -count=1 -v ./test/guestlab

# The guest lab's benchmarks: blockwire's verbs build on kernel rxe against
# LIO isert on kernel rxe, the same Linux initiator (docs/performance.md).
guestlab-bench:
	BLOCKWIRE_GUESTLAB_BENCH=1 go test -tags guestlab -count=1 -v -timeout 30m ./test/guestlab

# The Debian package: dist/blockwire_*.deb (packaging/deb.sh, nfpm).
deb:
	packaging/deb.sh
