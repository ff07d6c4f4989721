#!/bin/bash
# SPDX-License-Identifier: MIT
# Owns the checks of the systemd boots (run-vm-systemd-test.sh), run inside the guest by
# gna-vm-test.service once systemd (PID 1) reached multi-user.target. The agent runs only as the
# installed gpu-node-agent.service (or, for --prepare-kernel, as the installed kernel postinst hook
# runs it); the checks look at what the kernel shows (/sys/module), the files dkms wrote, and the
# words in the unit's journal. Lines for the host, on the console and in /gna/state/results:
#   GNA-VM: PASS <check>      GNA-VM: FAIL <check>: <what>      GNA-VM: LOG <text>
# Phase 1 (kernel K): dkms-build-load, dkms-compile-error, dkms-headers-missing, prepare-kernel
#   (+ nvidia-real-* with the real driver); then it keeps /var/lib/dkms and /usr/lib/modules/K2 in
#   /gna/state/persist.tar, the disk the next boot finds.
# Phase 2 (kernel K2): k2-booted, k2-loads-prepared.
. /gna/test.env
UNIT=gpu-node-agent.service
RES=/gna/state/results
export LC_ALL=C SYSTEMD_PAGER=cat SYSTEMD_COLORS=0

say() { echo "GNA-VM: $*" | tee -a "$RES" >/dev/console; }
pass() { say "PASS $1"; }
fail() { say "FAIL $1: $2"; dump_unit; }
check() { # NAME WHAT COMMAND...
        local name=$1 what=$2
        shift 2
        if "$@"; then pass "$name"; else fail "$name" "$what"; fi
}
live() { [ "$(cat /sys/module/$1/initstate 2>/dev/null)" = live ]; }
absent() { [ ! -e /sys/module/$1 ]; }
journal() { journalctl -b --no-pager -o cat -u "$UNIT" --since "@$since"; }
has_journal() { journal | grep -qF -- "$1"; }
dump_unit() {
        journal | tail -n 40 | sed 's/^/GNA-VM: LOG journal: /' | tee -a "$RES" >/dev/console
        systemctl status --no-pager -l "$UNIT" 2>&1 | tail -n 15 | sed 's/^/GNA-VM: LOG status: /' | tee -a "$RES" >/dev/console
}
# wait_for SECONDS COMMAND...: poll until COMMAND succeeds.
wait_for() {
        local end=$((SECONDS + $1))
        shift
        while [ $SECONDS -lt $end ]; do
                "$@" && return 0
                sleep 2
        done
        return 1
}

config() { # MODULES_DIR DKMS_ENABLED
        mkdir -p /etc/gpu-node-agent
        cat >/etc/gpu-node-agent/agent.yaml <<EOF
paths:
  sys: /gna/sys
  pci-ids: /gna/pci.ids
  modules: $1
driver:
  modeset: true
  peermem: off
  dkms:
    enabled: $2
devices:
  enabled: false
fabric:
  persistenced: off
  fabricmanager: off
cdi:
  enabled: false
labels:
  enabled: false
EOF
}

# start_agent: a fresh start of the installed unit, with its persistent state forgotten so that each
# case is judged on its own (the retry bookkeeping of a previous case must not decide this one).
start_agent() {
        systemctl stop "$UNIT" 2>/dev/null
        systemctl reset-failed "$UNIT" 2>/dev/null
        rm -rf /var/lib/gpu-node-agent /run/gpu-node-agent
        since=$(date +%s)
        sleep 1
        systemctl start --no-block "$UNIT"
}
unload_nvidia() {
        systemctl stop "$UNIT" 2>/dev/null
        for m in nvidia_peermem nvidia_drm nvidia_modeset nvidia_uvm nvidia; do
                [ -e /sys/module/$m ] && rmmod $m
        done
        return 0
}
dkms_ko() { echo "/lib/modules/$1/updates/dkms/nvidia-current.ko"; }

phase1() {
        say "BOOTED $(uname -r) phase 1, systemd $(systemctl --version | head -n1 | cut -d' ' -f2), up $(cut -d' ' -f1 /proc/uptime)s"
        # The unit as installed (meson install): the file systemd loaded is ours, not a test copy.
        check unit-installed "gpu-node-agent.service is not the meson-installed /usr/lib/systemd/system unit" \
                eval 'case $(systemctl show -P FragmentPath $UNIT) in /usr/lib/systemd/system/$UNIT|/lib/systemd/system/$UNIT) ;; *) false ;; esac &&
                      systemctl show -P ProtectSystem $UNIT | grep -qx strict'

        # (a) The package's postinst registered the source; the agent finds no module for the
        #     running kernel, builds it with dkms under its own sandbox, and loads it.
        dkms add "nvidia-current/$DKMS_VERSION" >/tmp/dkms-add.log 2>&1 || say "LOG dkms add: $(cat /tmp/dkms-add.log)"
        config /lib/modules true
        start_agent
        wait_for 900 eval 'live nvidia_modeset || has_journal "DKMS failed" || has_journal "DKMS cannot"'
        check dkms-build-load "the agent under the installed unit did not build the module with dkms and load it" \
                eval 'live nvidia && live nvidia_uvm && live nvidia_modeset && [ -f "$(dkms_ko $K)" ] &&
                      has_journal "Built and installed" && ! has_journal "Read-only file system"'
        say "LOG dkms build under the unit: $(journal | grep -o 'Built and installed.*' | head -n1)"
        systemctl is-active -q "$UNIT" && pass dkms-unit-active || fail dkms-unit-active "the unit is not active after the build"
        unload_nvidia
        dkms remove "nvidia-current/$DKMS_VERSION" --all >/dev/null 2>&1

        # (b) A source that does not compile: the make.log is named, with the compiler's error.
        bad=${DKMS_VERSION%.*}.99
        cp -r "/usr/src/nvidia-current-$DKMS_VERSION" "/usr/src/nvidia-current-$bad"
        sed -i "s/^PACKAGE_VERSION=.*/PACKAGE_VERSION=\"$bad\"/" "/usr/src/nvidia-current-$bad/dkms.conf"
        # A fatal error (a missing header) on the first line of every source: gcc stops there, and
        # so does every job of the parallel make at once (an #error lets gcc go on compiling the whole
        # file, a minute under TCG); it is still the compiler's own error in the make.log.
        for f in nv.c uvm.c modeset.c; do
                sed -i '1i #include "deliberately broken by the vm test.h"' "/usr/src/nvidia-current-$bad/$f"
        done
        dkms add "nvidia-current/$bad" >/dev/null 2>&1
        start_agent
        wait_for 900 eval 'has_journal "DKMS failed" || has_journal "DKMS cannot" || live nvidia'
        log=/var/lib/dkms/nvidia-current/$bad/build/make.log
        check dkms-compile-error "a compile error was not reported with the make.log path and the compiler's error" \
                eval 'absent nvidia && has_journal "the compiler output is in $log" &&
                      has_journal "deliberately broken by the vm test" && [ -f "$log" ]'
        say "LOG compile error: $(journal | grep -o 'DKMS failed.*' | head -n1)"
        unload_nvidia
        dkms remove "nvidia-current/$bad" --all >/dev/null 2>&1

        # (c) No headers for the running kernel: the package to install is named.
        dkms add "nvidia-current/$DKMS_VERSION" >/dev/null 2>&1
        mv "/usr/lib/modules/$K/build" "/usr/lib/modules/$K/build.away"
        start_agent
        wait_for 600 eval 'has_journal "linux-headers-" || live nvidia'
        check dkms-headers-missing "missing headers were not reported with the package to install" \
                eval 'absent nvidia && has_journal "apt-get install linux-headers-$K"'
        say "LOG headers missing: $(journal | grep -m1 'linux-headers-' | cut -c1-300)"
        unload_nvidia
        mv "/usr/lib/modules/$K/build.away" "/usr/lib/modules/$K/build"

        [ -n "$NVIDIA" ] && real_driver

        # (d) A second kernel is installed (its headers too): the kernel package's postinst runs the
        #     installed hook, which prepares the module for it without loading anything.
        if [ -n "$K2" ]; then
                config /lib/modules true
                /etc/kernel/postinst.d/zz-gpu-node-agent "$K2" "/boot/vmlinuz-$K2" >/tmp/prepare.log 2>&1
                rc=$?
                sed 's/^/GNA-VM: LOG prepare-kernel: /' /tmp/prepare.log | tail -n 20 | tee -a "$RES" >/dev/console
                check prepare-kernel "the postinst hook's --prepare-kernel $K2 did not build the module for $K2 (rc=$rc)" \
                        eval '[ $rc -eq 0 ] && [ -f "$(dkms_ko $K2)" ] &&
                              [ "$(modinfo -F vermagic "$(dkms_ko $K2)" | cut -d" " -f1)" = "$K2" ] &&
                              grep -q "updates/dkms/nvidia-current.ko" /lib/modules/$K2/modules.dep'
                sha256sum "$(dkms_ko $K2)" | cut -d' ' -f1 >/gna/state/k2.sha256
                config /lib/modules true
                tar -cf /gna/state/persist.tar -C / var/lib/dkms "usr/lib/modules/$K2" etc/gpu-node-agent 2>/dev/null ||
                        fail persist "cannot keep the state for the next boot"
        fi
}

# Debian's real nvidia-current, built by dkms on the host, installed where Debian's dkms installs it,
# with nvidia-kernel-support's modprobe.d files linked as nvidia-alternative links them, loaded by the
# agent under the unit. No GPU in the guest: the module's init fails with ENODEV ("NVRM: No NVIDIA GPU
# found"), and the agent must say that rather than a generic load failure.
real_driver() {
        local d=/lib/modules/$K/updates/dkms f
        mkdir -p "$d"
        cp /usr/lib/gna-nvidia/ko/*.ko "$d/"
        depmod "$K"
        for f in nvidia-modprobe.conf:nvidia.conf nvidia-options.conf:nvidia-options.conf \
                 nvidia-blacklists-nouveau.conf:nvidia-blacklists-nouveau.conf; do
                ln -sf "/etc/nvidia/current/${f%%:*}" "/etc/alternatives/nvidia--${f%%:*}"
                ln -sf "/etc/alternatives/nvidia--${f%%:*}" "/etc/modprobe.d/${f#*:}"
        done
        ko=$d/nvidia-current.ko
        check nvidia-real-modinfo "the real module's modinfo is not version $NVIDIA for $K with its GSP firmware, or the firmware is not installed" \
                eval '[ "$(modinfo -F version $ko)" = "$NVIDIA" ] && [ "$(modinfo -F vermagic $ko | cut -d" " -f1)" = "$K" ] &&
                      modinfo -F firmware $ko | grep -qx "nvidia/$NVIDIA/gsp_ga10x.bin" &&
                      [ -f "/lib/firmware/nvidia/$NVIDIA/gsp_ga10x.bin" ]'
        config /lib/modules false
        start_agent
        wait_for 300 eval 'journal | grep -q "Stage driver: running → " || live nvidia'
        sleep 3
        journal | grep -v 'libkmod' | grep -i 'driver\|nvidia\|GPU' | head -n 12 | sed 's/^/GNA-VM: LOG real nvidia: /' | tee -a "$RES" >/dev/console
        dmesg | grep -i 'NVRM' | tail -n 5 | sed 's/^/GNA-VM: LOG real nvidia dmesg: /' | tee -a "$RES" >/dev/console
        check nvidia-real-enodev "the real module's ENODEV was not reported as 'no NVIDIA GPU bound to the driver'" \
                eval 'absent nvidia && dmesg | grep -q "NVRM: No NVIDIA GPU found" &&
                      journal | grep -qF "ENODEV" && journal | grep -qF "no NVIDIA GPU is bound to the driver"'
        unload_nvidia
        rm -f /etc/modprobe.d/nvidia*.conf "$d"/nvidia-current*.ko
        depmod "$K"
}

phase2() {
        say "BOOTED $(uname -r) phase 2, up $(cut -d' ' -f1 /proc/uptime)s"
        check k2-booted "the second kernel $K2 is not the one running ($(uname -r))" [ "$(uname -r)" = "$K2" ]
        start_agent
        wait_for 600 eval 'live nvidia_modeset || has_journal "DKMS" || has_journal "failed"'
        check k2-loads-prepared "the module --prepare-kernel built in the previous boot was not loaded as it was" \
                eval 'live nvidia && live nvidia_modeset &&
                      [ "$(sha256sum "$(dkms_ko $K2)" | cut -d" " -f1)" = "$(cat /gna/state/k2.sha256)" ] &&
                      ! has_journal "Built and installed"'
}

since=$(date +%s)
# The unit's journal, live on the console (console-<release>.log on the host), for diagnosis.
journalctl -f -n 0 -o short-monotonic -u "$UNIT" 2>/dev/null | grep --line-buffered -v 'libkmod' |
        sed -u 's/^/GNA-VM: LOG live: /' >/dev/console &
case $PHASE in
1) phase1 ;;
2) phase2 ;;
esac
say "END phase $PHASE at $(cut -d' ' -f1 /proc/uptime)s"
systemctl --no-block poweroff
