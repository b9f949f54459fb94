# Conveniences; the README's commands work without make.
.PHONY: test bench fuzz

test:
	go test -race ./...

# Side-by-side with tgt (needs root and: apt-get install tgt qemu-utils
# qemu-block-extra libiscsi-bin iperf3).
bench:
	go run ./bench -rounds 3

# A longer fuzzing pass: FUZZTIME per target (default 2m).
FUZZTIME ?= 2m
fuzz:
	FUZZTIME=$(FUZZTIME) bash -c 'for t in "./iscsi/pdu FuzzDecodeBHS" "./iscsi/pdu FuzzParseAHS" "./iscsi/text FuzzParse" "./iscsi/text FuzzNegotiate" "./iscsi/auth FuzzCHAP" "./scsi FuzzParseSense" "./scsi FuzzDecodeRW" "./target FuzzExecuteCDB" "./iscsi/target FuzzTargetConnection" "./iscsi/initiator FuzzParseURL"; do set -- $$t; go test -run "^$$" -fuzz "^$$2$$" -fuzztime $(FUZZTIME) $$1 || exit 1; done'
