#!/bin/bash
# SPDX-License-Identifier: MIT
# Owns the 'rpm' test: packaging/rpm/gpu-node-agent.spec builds with rpmbuild (-bb --nodeps: this is
# Debian, so RHEL's BuildRequires cannot be checked here) from a tarball of the source tree, and the
# binary package holds exactly the files of the Debian package's layout, plus the RHEL pci.ids drop-in.
# Exit 77 (skip) when rpmbuild is missing (scripts/deps.sh installs Debian's rpm package).
set -euo pipefail

src=${GNA_SOURCE_ROOT:?run through meson test}
build=${GNA_BUILD_ROOT:?run through meson test}
command -v rpmbuild >/dev/null || { echo "SKIP: rpmbuild is missing (Debian package rpm)"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

spec=$src/packaging/rpm/gpu-node-agent.spec
version=$(sed -n 's/^Version:[[:space:]]*//p' "$spec")
meson_version=$(sed -n "s/^[[:space:]]*version : '\(.*\)',/\1/p" "$src/meson.build" | head -n1)
[ "$version" = "$meson_version" ] || fail "the spec's Version $version differs from meson.build's $meson_version"

top=$(mktemp -d "$build/rpmbuild.XXXXXX")
trap 'rm -rf "$top"' EXIT
mkdir -p "$top/SOURCES" "$top/stage/gpu-node-agent-$version"
tar -C "$src" --exclude='./build*' --exclude=./.git --exclude=./debian -cf - . |
        tar -C "$top/stage/gpu-node-agent-$version" -xf -
tar -C "$top/stage" -czf "$top/SOURCES/gpu-node-agent-$version.tar.gz" "gpu-node-agent-$version"

if ! rpmbuild -bb --nodeps --define "_topdir $top" --define "_smp_mflags -j2" "$spec" >"$top/rpmbuild.log" 2>&1; then
        tail -n 40 "$top/rpmbuild.log" >&2
        fail "rpmbuild -bb --nodeps $spec failed (last lines above)"
fi
rpm=$(find "$top/RPMS" -name "gpu-node-agent-$version-*.rpm" ! -name '*debug*' | head -n1)
[ -n "$rpm" ] || fail "rpmbuild made no gpu-node-agent-$version-*.rpm"
echo "built $(basename "$rpm")"

expected=(
        /etc/kernel/postinst.d/zz-gpu-node-agent
        /run/gpu-node-agent
        /usr/bin/gpunodectl
        /usr/lib/gpu-node-agent
        /usr/lib/gpu-node-agent/conf.d
        /usr/lib/gpu-node-agent/conf.d/00-defaults.yaml
        /usr/lib/systemd/system/gpu-node-agent.service
        /usr/lib/tmpfiles.d/gpu-node-agent.conf
        /usr/sbin/gpu-node-agent
        /usr/share/dbus-1/system.d/org.gpunodeagent.Agent1.conf
        /usr/share/doc/gpu-node-agent
        /usr/share/doc/gpu-node-agent/HACKING.md
        /usr/share/doc/gpu-node-agent/configuration.md
        /usr/share/doc/gpu-node-agent/dbus
        /usr/share/doc/gpu-node-agent/dbus/org.gpunodeagent.Agent1.Gpu.md
        /usr/share/doc/gpu-node-agent/dbus/org.gpunodeagent.Agent1.Manager.md
        /usr/share/doc/gpu-node-agent/driver.md
        /usr/share/doc/gpu-node-agent/examples
        /usr/share/doc/gpu-node-agent/examples/agent.yaml
        /usr/share/doc/gpu-node-agent/kubernetes
        /usr/share/doc/gpu-node-agent/kubernetes.md
        /usr/share/doc/gpu-node-agent/kubernetes/rbac.yaml
        /usr/share/doc/gpu-node-agent/mig.md
        /usr/share/doc/gpu-node-agent/threat-model.md
        /usr/share/gpu-node-agent
        /usr/share/gpu-node-agent/remote-config.conf
        /usr/share/man/man1/gpunodectl.1
        /usr/share/man/man5/gpu-node-agent.yaml.5
        /usr/share/man/man8/gpu-node-agent.8
        /var/lib/gpu-node-agent
)
# Man pages are compressed by the distribution's brp scripts (gzip on RHEL, none with Debian's rpm);
# build-id links are rpmbuild's own.
got=$(rpm -qlp "$rpm" 2>/dev/null | grep -v '^/usr/lib/\.build-id' | sed 's/\.\(gz\|bz2\|xz\|zst\)$//' | sort)
want=$(printf '%s\n' "${expected[@]}" | sort)
if [ "$got" != "$want" ]; then
        diff <(echo "$want") <(echo "$got") >&2 || :
        fail "rpm -qlp $(basename "$rpm") lists other files than expected (diff: - expected, + got)"
fi
echo "rpm -qlp: the ${#expected[@]} expected paths"

# The scriptlets: enable/stop/restart through systemd's macros where they exist, --cleanup on erase.
scripts=$(rpm -qp --scripts "$rpm" 2>/dev/null)
grep -q 'gpu-node-agent --cleanup' <<<"$scripts" || fail "no --cleanup in the erase scriptlet:\n$scripts"
grep -q 'rm -rf /var/lib/gpu-node-agent' <<<"$scripts" || fail "the state directory is not removed on erase:\n$scripts"
# Runtime dependencies as on RHEL: hwdata for pci.ids, dbus, procps-ng for ExecReload=, and libcurl and
# libcrypto, which the agent dlopen()s (rpm's automatic dependencies cannot see them).
reqs=$(rpm -qp --requires "$rpm" 2>/dev/null)
for r in hwdata dbus procps-ng 'libcurl.so.4()(64bit)' 'libcrypto.so.3()(64bit)'; do
        grep -qx "$r" <<<"$reqs" || fail "the package does not require $r"
done
echo "scriptlets and Requires: as expected"
