#!/usr/bin/env bash
# deb.sh: builds dist/blockwire_VERSION_ARCH.deb — the static binary, its
# man page (from its own help), bash completion, the systemd unit and a
# configuration that serves nothing until edited — with nfpm (a tool
# dependency of the module: go.mod's tool directive, run as go tool nfpm).
# Usage: packaging/deb.sh   (or: make deb)
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf dist && mkdir -p dist
# A release tag (v1.2.3) gives 1.2.3 (1.2.3.4.gSHA past it); without one,
# 0.0.0~git.SHA, which any release sorts above.
if v=$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null); then
	v=${v#v}
else
	v="0.0.0~git.$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
fi
export BLOCKWIRE_VERSION=${v//-/.}
export BLOCKWIRE_ARCH=$(go env GOARCH)
CGO_ENABLED=0 go build -trimpath -ldflags "-X main.buildVersion=$BLOCKWIRE_VERSION" -o dist/blockwire ./cmd/blockwire
go run ./packaging/man dist/blockwire | gzip -9n > dist/blockwire.1.gz
dist/blockwire completion bash > dist/blockwire.bash
go tool nfpm pkg --packager deb --config packaging/nfpm.yaml --target dist/
ls dist/*.deb
