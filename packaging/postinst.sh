#!/bin/sh
# After install: tell systemd of the unit (when it runs); the service is
# not enabled — /etc/blockwire/blockwire.toml serves nothing until edited.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
