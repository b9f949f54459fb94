#!/usr/bin/env bash
# check.sh DEB: installs the package on this machine (apt), checks what it
# put where, starts the service with a test configuration — through
# systemctl when systemd runs, else as the unit's ExecStartPre/ExecStart
# lines say — reaches it with libiscsi's iscsi-ls and the admin socket,
# stops it (SIGTERM: clean exit), and purges the package again.
set -euo pipefail
deb=$(realpath "$1")
fail() { echo "packaging: $*" >&2; exit 1; }
# It installs and purges the package and removes /etc/blockwire: never on
# a machine where blockwire is in use.
if [ -e /etc/blockwire ] || dpkg -s blockwire >/dev/null 2>&1; then
	fail "blockwire is installed or configured here already: run this on a scratch machine (CI's)"
fi
apt-get install -y -qq "$deb" >/dev/null
trap 'apt-get purge -y -qq blockwire >/dev/null 2>&1 || true; rm -rf /etc/blockwire /var/lib/blockwire' EXIT
for f in /usr/bin/blockwire /usr/lib/systemd/system/blockwire.service /etc/blockwire/blockwire.toml \
	/usr/share/man/man1/blockwire.1.gz /usr/share/bash-completion/completions/blockwire \
	/usr/share/doc/blockwire/examples/blockwire.toml; do
	[ -e "$f" ] || fail "$f not installed"
done
# Searched in a file, not through a pipe: under pipefail, grep -q leaving
# early makes zcat die of SIGPIPE once the page outgrows the pipe's buffer.
zcat /usr/share/man/man1/blockwire.1.gz > /tmp/pkgman.roff
grep -q '^\.SS serve' /tmp/pkgman.roff || fail "the man page lacks serve"
grep -q '^\.SH CONFIGURATION' /tmp/pkgman.roff || fail "the man page lacks its CONFIGURATION section"
grep -q '_blockwire' /usr/share/bash-completion/completions/blockwire || grep -q 'complete' /usr/share/bash-completion/completions/blockwire || fail "no completion"
# As installed, the configuration serves nothing: the unit's check refuses it.
if blockwire config check /etc/blockwire/blockwire.toml >/tmp/pkgcheck.out 2>&1; then
	fail "the installed configuration passed config check (it should serve nothing until edited)"
fi
grep -q "serves nothing" /tmp/pkgcheck.out || { cat /tmp/pkgcheck.out; fail "config check gave another reason"; }
pv=$(dpkg-query -W -f='${Version}' blockwire)
grep -qF "blockwire $pv " <<<"$(blockwire version)" || { blockwire version; fail "blockwire version does not name the package's version $pv"; }
echo "packaging: installed; the default configuration serves nothing until edited"
# A test configuration: one file LUN where the unit may write.
cat > /etc/blockwire/blockwire.toml <<'TOML'
listen = ["127.0.0.1:3260"]
[[target]]
name = "iqn.2026-11.org.example:packaged"
[[target.lun]]
id = 0
file = "/var/lib/blockwire/disk0.img"
size = "16MiB"
TOML
unit=/usr/lib/systemd/system/blockwire.service
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload
	start() { systemctl start blockwire; }
	stop() { systemctl stop blockwire; }
else
	# No systemd here: what the unit runs, as it runs it.
	install -d -m 0750 /run/blockwire /var/lib/blockwire
	pre=$(sed -n 's/^ExecStartPre=//p' $unit)
	cmd=$(sed -n 's/^ExecStart=//p' $unit)
	start() {
		$pre || fail "ExecStartPre failed: $pre"
		$cmd >> /tmp/pkgserve.log 2>&1 &
		pid=$!
	}
	stop() { kill -TERM $pid; wait $pid || { tail -20 /tmp/pkgserve.log; fail "the service did not stop cleanly"; }; }
fi
up() { for i in $(seq 1 50); do blockwire admin luns >/dev/null 2>&1 && return; sleep 0.2; done; tail -20 /tmp/pkgserve.log; fail "the service did not come up"; }
start
up
out=$(iscsi-ls -s iscsi://127.0.0.1:3260) || fail "iscsi-ls failed"
echo "$out"
grep -q "iqn.2026-11.org.example:packaged" <<<"$out" || fail "iscsi-ls does not list the target"
grep -q "Lun:0" <<<"$out" || fail "iscsi-ls does not list LUN 0"
grep -q '"size": 16777216' <<<"$(blockwire admin --json luns)" || fail "admin luns over the installed socket"
# A live change lasts: resized with the admin verb, the service restarted
# as the unit runs it, the change is still there; /etc/blockwire unchanged.
before=$(sha256sum /etc/blockwire/blockwire.toml)
blockwire admin resize iqn.2026-11.org.example:packaged 0 32MiB >/dev/null || fail "admin resize on the packaged service"
stop
start
up
grep -q '"size": 33554432' <<<"$(blockwire admin --json luns)" || { blockwire admin luns; fail "the resize did not outlast a restart"; }
[ "$(stat -c %s /var/lib/blockwire/disk0.img)" = 33554432 ] || fail "the image is not 32 MiB after the restart"
grep -q "no changes" <<<"$(blockwire admin reload --dry-run)" || { blockwire admin reload --dry-run; fail "a dry run of the unchanged file shows changes"; }
[ "$(sha256sum /etc/blockwire/blockwire.toml)" = "$before" ] || fail "the configuration file was rewritten"
[ -s /var/lib/blockwire/state.toml ] || fail "no state in /var/lib/blockwire/state.toml"
stop
echo "packaging: the packaged service served, iscsi-ls reached it, a live resize outlasted a restart, it stopped cleanly"
