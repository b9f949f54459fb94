#!/bin/sh
# Before removal: stop the service (SIGTERM: initiators get an Async
# Logout, writes are flushed).
set -e
if [ -d /run/systemd/system ]; then
	systemctl stop blockwire >/dev/null 2>&1 || true
fi
