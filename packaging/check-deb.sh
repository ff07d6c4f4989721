#!/bin/bash
# SPDX-License-Identifier: MIT
# Owns the proof that the Debian package builds in a clean build root and installs, enables and
# purges cleanly. It installs packages (the build dependencies, lintian, the built .deb), so it is meant
# for a throw-away root, as CI runs it:
#
#   ../shared/tools/fresh-machine.sh --keep-going . LOGDIR ./packaging/check-deb.sh
#
# Steps, each failing the script with the reason:
#   1. apt-get build-dep ./ (nothing else installed by hand), then dpkg-buildpackage -us -uc -b with
#      DEB_BUILD_OPTIONS=nocheck (no test may run) and again with the tests;
#   2. lintian --pedantic on the result: no error, warning or pedantic tag that is not overridden;
#   3. apt-get install ./gpu-node-agent_*.deb: the unit is enabled (deb-systemd-helper);
#   4. the installed agent runs --oneshot on a simulated node (the build tree's fixtures and fake
#      NVML) and writes its files where a real host has them: the NFD feature file, /run/cdi/nvidia.yaml,
#      /run/gpu-node-agent/, /var/lib/gpu-node-agent/;
#   5. apt-get purge: none of those files, nor any file of the package, is left.
# Run outside a container it refuses, unless --yes-install-here is given.
set -euo pipefail

say() { printf '[check-deb] %s\n' "$*"; }
fail() { printf '[check-deb] FAIL: %s\n' "$*" >&2; exit 1; }

if [ "${1:-}" != --yes-install-here ] && [ -z "${container:-}" ] && ! grep -qa 'container=' /proc/1/environ 2>/dev/null; then
        fail "this installs packages; run it in a throw-away root (fresh-machine.sh), or pass --yes-install-here"
fi
[ "$(id -u)" = 0 ] || fail "needs root (apt-get build-dep, dpkg -i)"
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/check-deb.XXXXXX)
export DEBIAN_FRONTEND=noninteractive
apt_get() { apt-get -o DPkg::Lock::Timeout=600 -q "$@"; }

# --- 1. build in a root that has only what build-dep installs -----------------------------------------
say "copying the source to $work/gpu-node-agent"
mkdir "$work/gpu-node-agent"
tar -C "$src" --exclude='./build*' --exclude=./.git --exclude=./debian -cf - . | tar -C "$work/gpu-node-agent" -xf -
cp -r "$src/packaging/debian" "$work/gpu-node-agent/debian"
cd "$work/gpu-node-agent"

apt_get update >/dev/null
say "apt-get build-dep ./"
apt_get build-dep -y ./ >"$work/build-dep.log" 2>&1 || { tail -n 30 "$work/build-dep.log"; fail "apt-get build-dep ./ failed"; }

say "DEB_BUILD_OPTIONS=nocheck dpkg-buildpackage -us -uc -b"
DEB_BUILD_OPTIONS=nocheck DEB_BUILD_PROFILES=nocheck dpkg-buildpackage -us -uc -b -Pnocheck >"$work/build-nocheck.log" 2>&1 ||
        { tail -n 40 "$work/build-nocheck.log"; fail "the nocheck build failed"; }
grep -q 'meson test' "$work/build-nocheck.log" && fail "nocheck was not honoured: the tests ran"
say "nocheck honoured: no test ran"


t0=$(date +%s)
say "dpkg-buildpackage -us -uc -b (with the tests)"
dpkg-buildpackage -us -uc -b >"$work/build.log" 2>&1 || { tail -n 60 "$work/build.log"; fail "dpkg-buildpackage with the tests failed (log: $work/build.log)"; }
grep -E '^(Ok|Fail|Skipped|Timeout|Expected Fail|Unexpected Pass):' "$work/build.log" | tr -s ' ' | paste -sd' ' |
        sed 's/^/[check-deb] package tests: /'
grep -E '^ *[0-9]+/[0-9]+ .* SKIP ' "$work/build.log" | sed 's/^ */[check-deb] skipped in the package build: /' || :
grep -Eq '^Fail: +0 *$' "$work/build.log" || fail "the package's tests did not all pass (log: $work/build.log)"
say "built with tests in $(( $(date +%s) - t0 )) s"


# --- 2. lintian ---------------------------------------------------------------------------------------
apt_get install -y --no-install-recommends lintian >/dev/null
changes=$(ls "$work"/gpu-node-agent_*_amd64.changes 2>/dev/null || ls "$work"/gpu-node-agent_*.changes)
lintian --pedantic --fail-on error,warning,pedantic "$changes" >"$work/lintian.log" 2>&1 ||
        { cat "$work/lintian.log"; fail "lintian --pedantic reported tags (above)"; }
say "lintian --pedantic: clean (overrides in debian/*.lintian-overrides say why)"

# --- 3. install and enable ----------------------------------------------------------------------------
stamp="$work/stamp"
touch "$stamp"
sleep 1
apt_get install -y "$(ls "$work"/gpu-node-agent_*.deb | grep -v dbgsym)" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "installing the package failed"; }
[ -L /etc/systemd/system/multi-user.target.wants/gpu-node-agent.service ] ||
        fail "the unit is not enabled after install (no multi-user.target.wants link)"
say "installed; unit enabled ($(readlink /etc/systemd/system/multi-user.target.wants/gpu-node-agent.service))"

# --- 4. let the installed agent write its files where a host has them ---------------------------------
node="$work/gpu-node-agent/debian/build/tests/fixtures/nodes/dgx-h100"
fake="$work/gpu-node-agent/debian/build/tests/fakes/libnvidia-ml.so.1"
[ -d "$node/sys" ] && [ -f "$fake" ] || fail "the package build left no simulated node ($node) or fake NVML"
mkdir -p /etc/kubernetes/node-feature-discovery "$work/dev" /etc/gpu-node-agent/conf.d
cat >/etc/gpu-node-agent/conf.d/50-check-deb.yaml <<EOF
paths:
  sys: $node/sys
  proc: $node/proc
  dev: $work/dev
  pci-ids: $src/tests/fixtures/pci.ids
nvml:
  library: $fake
cdi:
  driver-root: $node
EOF
FAKE_NVML_DESCRIPTION=$node/nvml.yaml FAKE_NVML_STATE=$work/nvml.state /usr/sbin/gpu-node-agent --oneshot >"$work/oneshot.log" 2>&1 ||
        { cat "$work/oneshot.log"; fail "the installed agent's --oneshot failed"; }
written=(/etc/kubernetes/node-feature-discovery/features.d/gpu-node-agent /run/cdi/nvidia.yaml
         /run/gpu-node-agent/ready /run/gpu-node-agent/state)
for f in "${written[@]}"; do
        [ -e "$f" ] || fail "--oneshot did not write $f"
done
grep -q '^# +expiry-time=' /etc/kubernetes/node-feature-discovery/features.d/gpu-node-agent ||
        fail "the packaged default labels.expiry did not reach the feature file"
[ -d /var/lib/gpu-node-agent ] || fail "no state directory /var/lib/gpu-node-agent"
say "the installed agent wrote ${written[*]} /var/lib/gpu-node-agent"
rm /etc/gpu-node-agent/conf.d/50-check-deb.yaml
rmdir /etc/gpu-node-agent/conf.d /etc/gpu-node-agent

# --- 5. purge -----------------------------------------------------------------------------------------
apt_get purge -y gpu-node-agent >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "apt-get purge failed"; }
left=()
for f in "${written[@]}" /var/lib/gpu-node-agent /run/gpu-node-agent \
         /etc/kubernetes/node-feature-discovery/features.d/.gpu-node-agent; do
        [ -e "$f" ] && left+=("$f")
done
while IFS= read -r f; do
        left+=("$f")
done < <(find /etc /usr /var /run /lib -newer "$stamp" -name '*gpu-node-agent*' \
                -not -path '/var/lib/dpkg/*' -not -path '/var/cache/*' -not -path '/var/log/*' 2>/dev/null)
[ ${#left[@]} -eq 0 ] || fail "purge left: ${left[*]}"
[ -L /etc/systemd/system/multi-user.target.wants/gpu-node-agent.service ] && fail "purge left the unit enabled"
say "purged: no file of the package or of the agent left"
say "PASS"
