#!/bin/bash
# SPDX-License-Identifier: MIT
# Gates the sandboxing of the installed unit on `systemd-analyze security --offline=true`: the overall
# exposure must not rise above GNA_SECURITY_THRESHOLD (tenths, set in tests/e2e/meson.build).
set -u -o pipefail

fail() { echo "FAIL: $*" >&2; exit 1; }

command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze is not installed (Debian package systemd)"; exit 77; }
unit=${GNA_INSTALLED_UNIT:?GNA_INSTALLED_UNIT is not set; run this through meson test}
threshold=${GNA_SECURITY_THRESHOLD:?GNA_SECURITY_THRESHOLD is not set; run this through meson test}

out=$(SYSTEMD_COLORS=0 systemd-analyze security --offline=true --no-pager --threshold="$threshold" "$unit" 2>&1)
rc=$?
# The per-setting table only for what is not fully locked down, then the verdict.
grep -v '^✓' <<<"$out"
score=$(sed -n 's/^→ Overall exposure level for .*: \([0-9.]*\) .*/\1/p' <<<"$out")
[ -n "$score" ] || fail "could not find the overall exposure level in the output of systemd-analyze security"
gate=$(printf '%d.%d' $((threshold / 10)) $((threshold % 10)))
echo "exposure score of $(basename "$unit"): $score (gate $gate)"
[ $rc -eq 0 ] || fail "exposure $score of $unit is above the gate $gate: a sandboxing setting was lost or loosened"
echo "PASS"
