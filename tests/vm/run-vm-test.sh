#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Owns the real-kernel test 'vm-driver': set up (cached, setup.sh), build the initramfs
# (mkinitramfs.sh), boot the stock Debian kernel under QEMU with TCG once per kernel command line,
# and judge the "GNA-VM: " lines guest.sh printed on the serial console. Every boot must report
# each of its checks as passed; a boot that crashes, hangs or skips a check fails the test.
#
# Environment (meson sets the first ones): GNA_VM_SOURCE, GNA_VM_BUILD, GNA_VM_MODCTL, GNA_AGENT,
# GNA_FIXTURE_NODES, GNA_FIXTURE_PCI_IDS; optional: GNA_VM_CACHE (default /var/cache/gpu-node-agent-tests/vm as root, else GNA_VM_BUILD/cache),
# GNA_VM_KERNEL (a release instead of linux-headers-amd64's), GNA_VM_REQUIRE_AGENT=1 (fail unless
# the agent's own driver stage ran), GNA_VM_MODE=lib (drive the kernel through the module library
# with vm-modctl even when the agent's stage works), GNA_VM_NODE (fixture node, default dgx-h100: it has ConnectX),
# GNA_VM_BOOTS (names of the boots to run, e.g. "open"; default all).
# Exit 77 only when QEMU or the kernel headers cannot be installed.
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
node=$GNA_FIXTURE_NODES/${GNA_VM_NODE:-dgx-h100}
work=$build/run
mkdir -p "$cache" "$work"

grep -q '^nic' "$GNA_VM_SOURCE/../fixtures/nodes/${GNA_VM_NODE:-dgx-h100}.node" ||
        { echo "FAIL: fixture node ${GNA_VM_NODE:-dgx-h100} has no ConnectX NIC; the peermem checks need one." >&2; exit 1; }

# --- setup (cached) ---------------------------------------------------------------------------------
setup_out=$(bash "$src/setup.sh" "$cache")
rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { echo "FAIL: setup failed (exit $rc)." >&2; exit 1; }
eval "$setup_out"
# Debian's real open kernel modules (nvidia-open-kernel-dkms, contrib), built once by dkms for K
# (setup-nvidia.sh, cached in CACHE_DIR/nvidia-open-K): the 'open' boot. Without the archive and
# without a cache it is left out and the test ends as skipped (77) with the reason, once the other
# boots passed. GNA_VM_REAL_NVIDIA=0 leaves it out as it does the proprietary one.
OPEN='' open_skip=''
if [ "${GNA_VM_REAL_NVIDIA:-1}" != 0 ]; then
        open_out=$(bash "$src/setup-nvidia.sh" "$cache" "$K" open 2>"$work/setup-open.log")
        rc=$?
        cat "$work/setup-open.log" >&2
        case $rc in
        0) OPEN=$(sed -n 's/^NV=//p' <<<"$open_out") ;;
        77) open_skip=$(sed -n 's/^SKIP: //p' "$work/setup-open.log" | tail -n1) ;;
        *) echo "FAIL: setup-nvidia.sh (open) failed (exit $rc); see above." >&2; exit 1 ;;
        esac
fi
t_setup=$((SECONDS - t0))

# --- initramfs --------------------------------------------------------------------------------------
t1=$SECONDS
bash "$src/mkinitramfs.sh" "$work/initramfs.cpio.gz" "$K" "$DIR/kernel" "$MODS" "$GNA_AGENT" "$GNA_VM_MODCTL" \
        "$node" "$GNA_FIXTURE_PCI_IDS" "${REAL:-}" "$OPEN" || { echo "FAIL: building the initramfs failed." >&2; exit 1; }
t_initramfs=$((SECONDS - t1))

# --- boots ------------------------------------------------------------------------------------------
# name | extra kernel command line | checks that must pass
boots=(
        "main||load-live load-ipmi load-order options-modprobe-d options-config debian-naming peermem-waits-ib-core fast-path ib-core-live peermem-stub-refused peermem-stub-einval peermem-loaded unload-kernel-eagain unload-refused unload-holder-order enoexec-reported enoexec-kernel vermagic-kernel-accepts vermagic-accepted install-false-honoured softdep-pre-post blacklist-ignored remove-false-honoured unknown-parameter"
        "sig-enforce|module.sig_enforce=1|sig-enforce-on sig-intree-loads sig-rejected sig-kernel"
        "lockdown|lockdown=integrity|lockdown-on lockdown-reported lockdown-kernel"
)
# Debian's real nvidia-current (setup.sh builds it unless GNA_VM_REAL_NVIDIA=0): modinfo read right,
# loaded through Debian's own modprobe.d, and its ENODEV on a machine without a GPU said as such.
if [ -n "${REAL:-}" ]; then
        boots+=("real|gna.seq=real|real-modinfo real-debian-conf real-enodev real-enodev-kernel")
else
        echo "NOTE: Debian's real nvidia-current was not built (GNA_VM_REAL_NVIDIA=0): the 'real' boot is left out."
fi
# Debian's real open modules (nvidia-current-open): its own initramfs archive appended (the GSP
# firmware is large), loaded by the agent with driver.kernel-module-type: open, proprietary and auto.
if [ -n "$OPEN" ]; then
        cat "$work/initramfs.cpio.gz" "$work/initramfs-open.cpio.gz" >"$work/initramfs-with-open.cpio.gz"
        boots+=("open|gna.seq=open|open-modinfo open-firmware-named open-proprietary-missing open-chosen open-debian-conf open-enodev open-enodev-kernel open-auto|initramfs-with-open")
elif [ "${GNA_VM_REAL_NVIDIA:-1}" = 0 ]; then
        echo "NOTE: GNA_VM_REAL_NVIDIA=0: the 'open' boot (nvidia-open-kernel-dkms) is left out."
else
        echo "NOTE: the 'open' boot is left out: $open_skip"
fi

# GNA_VM_BOOTS="open real": only these boots (while working on one); the others are reported as left out.
if [ -n "${GNA_VM_BOOTS:-}" ]; then
        only=()
        for b in "${boots[@]}"; do
                [[ " $GNA_VM_BOOTS " == *" ${b%%|*} "* ]] && only+=("$b") || echo "NOTE: boot ${b%%|*} left out (GNA_VM_BOOTS)"
        done
        boots=("${only[@]}")
fi

# One boot at a time across the whole vm suite (a lock on the cache, shared with vm-systemd): three
# TCG guests on a loaded 2-core machine each run at a fraction of the speed and a fixed limit fires.
# The limit scales with GNA_TIMEOUT_SCALE.
limit=${GNA_VM_BOOT_TIMEOUT:-$(awk -v s="${GNA_TIMEOUT_SCALE:-1}" 'BEGIN { printf "%d", 180 * s }')}
boot() {
        local name=$1 extra=$2 initrd=${3:-initramfs} mem=512 start
        # The open boot's archive unpacks 60 MB of GSP firmware and a 60 MB module more.
        [ "$initrd" = initramfs ] || mem=1024
        exec 6>"$cache/.boot-lock"
        flock 6
        start=$SECONDS
        # Never KVM: on these machines it hangs or aborts with a stock kernel. no_timer_check: under
        # TCG on a loaded host the IO-APIC timer check can fail and panic the boot ("IO-APIC + timer
        # doesn't work"), as it can in any VM whose vCPU is starved.
        timeout "$limit" qemu-system-x86_64 -accel tcg -m "$mem" -nographic -no-reboot -nic none \
                -kernel "$DIR/kernel/vmlinuz" -initrd "$work/$initrd.cpio.gz" \
                -append "console=ttyS0 panic=-1 quiet no_timer_check rdinit=/init $extra${GNA_VM_MODE:+ gna.mode=$GNA_VM_MODE}" \
                </dev/null >"$work/console-$name.log" 2>&1
        echo "$? $((SECONDS - start))" >"$work/status-$name"
        exec 6>&-
}

t2=$SECONDS
pids=()
for b in "${boots[@]}"; do
        IFS='|' read -r name extra _ initrd <<<"$b"
        rm -f "$work/status-$name"
        boot "$name" "$extra" "$initrd" &
        pids+=($!)
done
wait "${pids[@]}"
t_boots=$((SECONDS - t2))

# --- verdict ----------------------------------------------------------------------------------------
failed=0
for b in "${boots[@]}"; do
        IFS='|' read -r name extra want _ <<<"$b"
        log=$work/console-$name.log
        read -r qrc secs <"$work/status-$name"
        # The console may put terminal escapes before a line: take what follows the prefix.
        lines=$(tr -d '\r' <"$log" | grep -ao 'GNA-VM: .*' | grep -v '^GNA-VM: LOG ')
        mode=$(sed -n 's/^GNA-VM: MODE //p' <<<"$lines")
        up=$(sed -n 's/^GNA-VM: BOOTED .* at \([0-9.]*\)s,.*/\1/p' <<<"$lines")
        down=$(sed -n 's/^GNA-VM: END .* at \([0-9.]*\)s$/\1/p' <<<"$lines")
        echo "boot $name (${extra:-default cmdline}): ${secs}s wall (kernel up at ${up:-?}s, checks done at ${down:-?}s guest time), qemu exit $qrc, mode: ${mode:-unknown}"
        bad=0
        if [ "$qrc" -eq 124 ]; then
                echo "  FAIL: the VM did not power off within $limit s"
                bad=1
        fi
        grep -q '^GNA-VM: END' <<<"$lines" || { echo "  FAIL: guest.sh did not finish"; bad=1; }
        while read -r l; do
                [ -n "$l" ] && { echo "  $l"; bad=1; }
        done < <(grep '^GNA-VM: FAIL ' <<<"$lines")
        for c in $want; do
                if grep -qx "GNA-VM: PASS $c" <<<"$lines"; then
                        echo "  ok   $c"
                elif ! grep -q "^GNA-VM: FAIL $c:" <<<"$lines"; then
                        echo "  FAIL $c: not reported"
                        bad=1
                fi
        done
        if [ "${GNA_VM_REQUIRE_AGENT:-0}" = 1 ] && [[ "$mode" != agent* ]]; then
                echo "  FAIL: GNA_VM_REQUIRE_AGENT=1 but the checks ran through the library ($mode)"
                bad=1
        fi
        if [ $bad -ne 0 ]; then
                failed=1
                echo "  --- console ($log) ---"
                tr -d '\r' <"$log" | tail -n 150 | sed 's/^/  | /'
        fi
done

echo "times: setup ${t_setup}s, initramfs ${t_initramfs}s, boots ${t_boots}s (one at a time), total $((SECONDS - t0))s"
if [ $failed -eq 0 ] && [ -n "$open_skip" ]; then
        echo "SKIP: every boot passed, but the open kernel modules could not be tested: $open_skip"
        exit 77
fi
exit $failed
