#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Owns the real-kernel test 'vm-systemd': the daemon under its installed unit, in a guest whose
# PID 1 is systemd, on the stock Debian kernel, with the real dkms. Boot 1 (release K, the installed
# linux-headers-amd64's): the agent builds the stand-in module with dkms and loads it, reports a
# compile error with the make.log, missing headers with the package, (with the real driver cached,
# see GNA_VM_NVIDIA) Debian's nvidia-current failing without a GPU, and the kernel postinst hook's
# --prepare-kernel builds for a second installed release K2. Boot 2 (K2): the agent loads what was
# prepared, without building. See guest-systemd.sh for the checks, mkroot-systemd.sh for the guest.
#
# Environment (meson sets the first ones): GNA_VM_SOURCE, GNA_VM_BUILD, GNA_MESON, GNA_BUILD_ROOT,
# GNA_FIXTURE_NODES, GNA_FIXTURE_PCI_IDS; optional: GNA_VM_CACHE (default /var/cache/gpu-node-agent-tests/vm as root, else GNA_VM_BUILD/cache),
# GNA_VM_KERNEL2 (the second release), GNA_VM_NVIDIA=1 (also Debian's real driver under the unit: its
# own host build takes minutes; default 0, because vm-driver's 'real' boot already loads Debian's driver
# built by setup.sh), GNA_VM_SYSTEMD=0 (skip this test), GNA_TIMEOUT_SCALE (multiplies every boot's time
# limit).
# Exit 77 with the reason when QEMU, the kernel headers, or the kernels cannot be had.
set -uo pipefail

t0=$SECONDS
src=${GNA_VM_SOURCE:?run through meson test}
build=${GNA_VM_BUILD:?run through meson test}
# The cache (kernels, DKMS builds, Debian's driver: minutes to make) outlives a build dir and a clone:
# /var/cache/gpu-node-agent-tests/vm when root, else under the build dir. GNA_VM_CACHE overrides.
if [ -n "${GNA_VM_CACHE:-}" ]; then
        cache=$GNA_VM_CACHE
elif [ "$(id -u)" = 0 ]; then
        cache=/var/cache/gpu-node-agent-tests/vm
else
        cache=$build/cache
fi
work=$build/run-systemd
node=$GNA_FIXTURE_NODES/h200
scale=${GNA_TIMEOUT_SCALE:-1}
mkdir -p "$cache" "$work"
cache=$(cd "$cache" && pwd)

skip() { echo "SKIP: $*" >&2; exit 77; }
[ "${GNA_VM_SYSTEMD:-1}" = 0 ] && skip "GNA_VM_SYSTEMD=0 (CI's pristine-root run leaves this long test to the first run)"
[ "$(id -u)" = 0 ] || skip "needs root (QEMU's 9p export of /usr with security_model=none, dkms)"

# --- setup (cached) -------------------------------------------------------------------------------
setup_out=$(bash "$src/setup.sh" "$cache") || { rc=$?; [ $rc -eq 77 ] && exit 77; echo "FAIL: setup.sh failed (exit $rc)" >&2; exit 1; }
eval "$setup_out"
sd_out=$(bash "$src/setup-systemd.sh" "$cache" "$K") || { rc=$?; [ $rc -eq 77 ] && exit 77; echo "FAIL: setup-systemd.sh failed (exit $rc)" >&2; exit 1; }
eval "$sd_out"
NV=
if [ "${GNA_VM_NVIDIA:-0}" = 1 ]; then
        nv_out=$(bash "$src/setup-nvidia.sh" "$cache" "$K")
        case $? in
        0) eval "$nv_out" ;;
        77) echo "note: Debian's real nvidia-current is not available; its checks do not run." ;;
        *) echo "FAIL: setup-nvidia.sh failed" >&2; exit 1 ;;
        esac
fi
t_setup=$((SECONDS - t0))

# --- install exactly what `meson install` installs ----------------------------------------------------
dest=$work/dest
rm -rf "$dest"
"${GNA_MESON:?run through meson test}" install -C "$GNA_BUILD_ROOT" --no-rebuild --quiet --destdir "$dest" >"$work/install.log" 2>&1 ||
        { cat "$work/install.log" >&2; echo "FAIL: meson install --destdir failed" >&2; exit 1; }
[ -f "$dest/usr/lib/systemd/system/gpu-node-agent.service" ] ||
        skip "meson install did not put the unit under /usr/lib/systemd/system (prefix is not /usr)"
bash "$src/mkroot-systemd.sh" "$work" "$K" "$KDIR" "$K2" "$K2DIR" "$dest" "$node" "$GNA_FIXTURE_PCI_IDS" "$NV" ||
        { echo "FAIL: building the guest root failed" >&2; exit 1; }
rm -rf "$work/state"
mkdir -p "$work/state"

# --- boots ------------------------------------------------------------------------------------------
# One boot at a time across the whole vm suite (flock on the cache): TCG on a loaded 2-core machine
# runs parallel guests at a fraction of the speed each, and a fixed limit would then fire. The limit
# itself scales with GNA_TIMEOUT_SCALE.
boot() { # RELEASE KERNEL_DIR LIMIT_S
        local rel=$1 kd=$2 limit=$3 start
        exec 6>"$cache/.boot-lock"
        flock 6
        start=$SECONDS
        timeout "$limit" qemu-system-x86_64 -accel tcg -smp 2 -m 2048 -nographic -no-reboot -nic none \
                -kernel "$kd/vmlinuz" -initrd "$work/initramfs-$rel.cpio.gz" \
                -virtfs local,path=/usr,mount_tag=hostusr,security_model=none,readonly=on \
                -virtfs local,path="$work/layer",mount_tag=gnalayer,security_model=none,readonly=on \
                -virtfs local,path="$work/state",mount_tag=gnastate,security_model=none \
                -append "console=ttyS0 panic=-1 quiet loglevel=3 systemd.show_status=0 rdinit=/init" \
                </dev/null >"$work/console-$rel.log" 2>&1
        qrc=$?
        exec 6>&-
        secs=$((SECONDS - start))
}

failed=0
judge() { # NAME LIMIT CHECKS...
        local name=$1 limit=$2 c bad=0
        shift 2
        local lines
        lines=$(tr -d '\r' <"$work/state/results" 2>/dev/null | grep -ao 'GNA-VM: .*' | grep -v '^GNA-VM: LOG ')
        echo "boot $name: ${secs}s wall, qemu exit $qrc"
        [ "$qrc" -ne 124 ] || { echo "  FAIL: the VM did not power off within ${limit}s"; bad=1; }
        grep -q "^GNA-VM: END" <<<"$lines" || { echo "  FAIL: guest-systemd.sh did not finish"; bad=1; }
        grep '^GNA-VM: FAIL ' <<<"$lines" | sed 's/^/  /' && bad=1
        for c in "$@"; do
                if grep -qx "GNA-VM: PASS $c" <<<"$lines"; then
                        echo "  ok   $c"
                elif ! grep -q "^GNA-VM: FAIL $c:" <<<"$lines"; then
                        echo "  FAIL $c: not reported"
                        bad=1
                fi
        done
        if [ $bad -ne 0 ]; then
                failed=1
                echo "  --- results and console ($work/console-$name.log) ---"
                tr -d '\r' <"$work/state/results" 2>/dev/null | sed 's/^/  | /'
                tr -d '\r' <"$work/console-$name.log" | grep -av '^GNA-VM' | tail -n 60 | sed 's/^/  | /'
        fi
        mv "$work/state/results" "$work/results-$name" 2>/dev/null
}

limit1=$(awk -v s="$scale" 'BEGIN { printf "%d", 1500 * s }')
t1=$SECONDS
boot "$K" "$KDIR" "$limit1"
checks1="unit-installed dkms-build-load dkms-unit-active dkms-compile-error dkms-headers-missing"
[ -z "$NV" ] || checks1+=" nvidia-real-modinfo nvidia-real-enodev"
[ -z "$K2" ] || checks1+=" prepare-kernel"
judge "$K" "$limit1" $checks1
if [ -n "$K2" ]; then
        limit2=$(awk -v s="$scale" 'BEGIN { printf "%d", 600 * s }')
        boot "$K2" "$K2DIR" "$limit2"
        judge "$K2" "$limit2" k2-booted k2-loads-prepared
fi
echo "times: setup ${t_setup}s, boots $((SECONDS - t1))s, total $((SECONDS - t0))s"
[ $failed -eq 0 ] || exit 1
[ -n "$K2" ] || skip "no second kernel release could be fetched, so --prepare-kernel and the boot into it did not run (everything else passed)"
exit 0
