#!/bin/bash
# SPDX-License-Identifier: MIT
# `systemd-analyze verify --man=no` on the unit with ExecStart= pointing at the built daemon: any
# message about our unit (bad setting, missing command, unknown dependency) fails the test.
set -u -o pipefail

fail() { echo "FAIL: $*" >&2; exit 1; }

command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze is not installed (Debian package systemd)"; exit 77; }
unit=${GNA_E2E_UNIT:?GNA_E2E_UNIT is not set; run this through meson test}
installed=${GNA_INSTALLED_UNIT:?GNA_INSTALLED_UNIT is not set; run this through meson test}
name=$(basename "$unit")

# The installed unit must have every @variable@ substituted.
if grep -n '@[A-Za-z_]*@' "$installed"; then
        fail "$installed still contains unsubstituted @variables@ (see the lines above); add them to unit_conf in units/meson.build"
fi
grep -q "^ExecStart=${GNA_AGENT}\$" "$unit" ||
        fail "$unit does not start the built daemon $GNA_AGENT; tests/e2e/meson.build must substitute @sbindir@"

verify() {
        # systemd-analyze also loads the units ours refers to; only messages about ours count.
        SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no "$1" 2>&1
}

out=$(verify "$unit"); rc=$?
[ -n "$out" ] && echo "$out"
ours=$(grep -F "$name" <<<"$out")
[ $rc -eq 0 ] || fail "systemd-analyze verify exited $rc on $unit"
[ -z "$ours" ] || fail "systemd-analyze verify warns about $name: $ours"

# The check above must be able to fail: a copy whose ExecStart= does not exist has to be reported,
# otherwise this systemd-analyze silently ignores the things we rely on it to catch.
tmp=$(mktemp -d) || fail "cannot create a temporary directory"
trap 'rm -rf "$tmp"' EXIT
sed "s|^ExecStart=.*|ExecStart=$tmp/no-such-daemon|" "$unit" > "$tmp/$name"
out=$(verify "$tmp/$name")
grep -F "$name" <<<"$out" | grep -q "no-such-daemon" ||
        fail "systemd-analyze verify did not report the missing ExecStart= binary of a broken copy (output: $out)"

echo "PASS: $unit verifies cleanly"
