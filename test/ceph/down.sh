#!/usr/bin/env bash
# down.sh DIR: stops the daemons up.sh started, by the PIDs it recorded,
# and removes DIR. SIGKILL: the cluster is thrown away (a SIGTERM makes the
# OSD wait seconds for the monitor).
D=${1:?usage: down.sh DIR}
if [ -f "$D/pids" ]; then
	while read -r _ pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$D/pids"
	for _ in $(seq 1 50); do
		alive=0
		while read -r _ pid; do
			if [ -d "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then alive=1; fi
		done <"$D/pids"
		[ "$alive" = 0 ] && break
		sleep 0.05
	done
fi
rm -rf "$D"
