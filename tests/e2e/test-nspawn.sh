#!/bin/bash
# SPDX-License-Identifier: MIT
# End to end in a real systemd: `meson install` into a staging directory, boot the host's own /usr
# (with the staged /usr laid over it) in systemd-nspawn --volatile=yes, point the agent at the
# simulated DGX H100 node, then check what an operator sees: `systemctl enable --now`, is-active,
# StatusText, properties on the real system bus, `gpunodectl wait-ready`, the NFD feature file, the
# ready file, reload, a watchdog restart after SIGSTOP, and a clean stop.
# Needs root; exits 77 (skip) with the reason when the host cannot do this.
set -u -o pipefail

T0=$(date +%s%N)
NODE=dgx-h100
NODE_GPUS=8
UNIT=gpu-node-agent.service
BUS_NAME=org.gpunodeagent.Agent1
BUS_PATH=/org/gpunodeagent/Agent1
BUS_IFACE=org.gpunodeagent.Agent1.Manager
NFD_DIR=/etc/kubernetes/node-feature-discovery
FEATURE_FILE=$NFD_DIR/features.d/gpu-node-agent

NS=       # PID of systemd-nspawn
CT=       # PID (host view) of the container's systemd
WORK=

skip() { echo "SKIP: $*"; exit 77; }
log() { printf '[%5.1fs] %s\n' "$(elapsed)" "$*"; }
elapsed() { local now; now=$(date +%s%N); echo "$(( (now - T0) / 1000000 ))" | awk '{ printf "%.1f", $1 / 1000 }'; }

# Runs a command inside the container, in all its namespaces, with a clean environment (the
# sanitizer options pass through for an ASan build of gpunodectl).
in_ct() {
        timeout 60 nsenter -t "$CT" -a env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
                SYSTEMD_PAGER=cat SYSTEMD_COLORS=0 \
                ASAN_OPTIONS="${ASAN_OPTIONS:-}" UBSAN_OPTIONS="${UBSAN_OPTIONS:-}" "$@"
}

diagnostics() {
        [ -n "$CT" ] && kill -0 "$CT" 2>/dev/null || return 0
        echo "---- systemctl status $UNIT (container) ----"
        in_ct systemctl status --no-pager -l "$UNIT"
        echo "---- journal of $UNIT (container, last 50 lines) ----"
        in_ct journalctl -b --no-pager -o short-monotonic -n 50 -u "$UNIT"
        echo "---- failed units (container) ----"
        in_ct systemctl --failed --no-pager --no-legend
        # What is still in the unit's cgroup, and in which state (a process that does not die is the
        # usual reason a restart does not come).
        local cg pid
        cg=$(in_ct systemctl show -P ControlGroup "$UNIT")
        if [ -n "$cg" ] && [ -r "/proc/$CT/root/sys/fs/cgroup$cg/cgroup.procs" ]; then
                echo "---- processes in $cg ----"
                while read -r pid; do
                        printf '%s %s state=%s wchan=%s\n' "$pid" "$(cat "/proc/$pid/comm" 2>/dev/null)" \
                                "$(awk '/^State:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)" \
                                "$(cat "/proc/$pid/wchan" 2>/dev/null)"
                done <"/proc/$CT/root/sys/fs/cgroup$cg/cgroup.procs"
        fi
}

fail() {
        # The reason comes last as well: meson shows only the end of a long log.
        echo "FAIL: $*" >&2
        diagnostics >&2
        if [ -n "$WORK" ] && [ -s "$WORK/console.log" ]; then
                echo "---- container console (last 30 lines) ----" >&2
                tail -n 30 "$WORK/console.log" >&2
        fi
        echo "FAIL: $*" >&2
        exit 1
}

# Polls "$@" every 0.1 s until it succeeds or $1 seconds passed.
wait_until() {
        local timeout=$1; shift
        local deadline=$(( $(date +%s) + timeout ))
        until "$@" >/dev/null 2>&1; do
                [ "$(date +%s)" -lt "$deadline" ] || return 1
                sleep 0.1
        done
}

nspawn_gone() { ! kill -0 "$NS" 2>/dev/null; }
unit_active() { [ "$(in_ct systemctl is-active "$UNIT")" = active ]; }

cleanup() {
        if [ -n "$NS" ] && kill -0 "$NS" 2>/dev/null; then
                # SIGTERM makes nspawn power the container off cleanly (about a second).
                kill -TERM "$NS" 2>/dev/null
                wait_until 15 nspawn_gone || kill -KILL "$NS" 2>/dev/null
                wait "$NS" 2>/dev/null
        fi
        [ -n "$WORK" ] && rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# ---- can this host do it? ----
[ "$(id -u)" -eq 0 ] || skip "booting a systemd-nspawn container needs root (run the e2e suite as root)"
# Inside a container already (the pristine-root run of .ci/run is a non-booted nspawn): a booted
# nspawn nested in it did not let the unit's processes go on stop and watchdog restart in two runs,
# where the same test passes on the host, which .ci/run's first ./scripts/test covers.
if [ -n "${container:-}" ] || grep -qa 'container=' /proc/1/environ 2>/dev/null; then
        skip "already inside a container (${container:-see /proc/1/environ}): a booted nspawn nested in it is not a real host; this test runs on the host"
fi
command -v systemd-nspawn >/dev/null || skip "systemd-nspawn is missing (Debian package systemd-container)"
command -v nsenter >/dev/null || skip "nsenter is missing (Debian package util-linux)"
[ -x /lib/systemd/systemd ] || skip "the host has no /lib/systemd/systemd to boot (Debian package systemd)"
command -v dbus-daemon >/dev/null || skip "dbus-daemon is missing, the container would have no system bus (Debian package dbus)"
for v in GNA_AGENT GNA_CTL GNA_FIXTURE_NODES GNA_FIXTURE_PCI_IDS GNA_BUILD_ROOT GNA_MESON GNA_INSTALLED_UNIT GNA_FAKE_NVML GNA_SOURCE_ROOT; do
        [ -n "${!v:-}" ] || { echo "FAIL: $v is not set; run this through meson test" >&2; exit 1; }
done
node_dir=$GNA_FIXTURE_NODES/$NODE
[ -d "$node_dir/sys/bus/pci/devices" ] || { echo "FAIL: simulated node $node_dir was not generated (build the fixture-nodes target)" >&2; exit 1; }
case "$GNA_BUILD_ROOT$node_dir$GNA_FIXTURE_PCI_IDS" in
        *:*) skip "a path contains ':', which systemd-nspawn --bind/--overlay cannot express" ;;
esac

WORK=$(mktemp -d "$GNA_BUILD_ROOT/e2e-nspawn.XXXXXX") || fail "cannot create a work directory in $GNA_BUILD_ROOT"

# ---- install exactly what `meson install` installs ----
dest=$WORK/dest
"$GNA_MESON" install -C "$GNA_BUILD_ROOT" --no-rebuild --quiet --destdir "$dest" >"$WORK/install.log" 2>&1 ||
        { cat "$WORK/install.log" >&2; fail "meson install --destdir $dest failed (output above)"; }
[ -f "$dest/usr/lib/systemd/system/$UNIT" ] ||
        skip "meson install did not put $UNIT under /usr/lib/systemd/system; this test boots the prefix=/usr layout"
exec_start=$(sed -n 's/^ExecStart=//p' "$dest/usr/lib/systemd/system/$UNIT")
for f in "$exec_start" /usr/share/dbus-1/system.d/$BUS_NAME.conf /usr/lib/tmpfiles.d/gpu-node-agent.conf; do
        [ -e "$dest$f" ] || fail "meson install did not install $f"
done
[ -x "$dest$exec_start" ] || fail "the installed $exec_start is not executable"
ctl=$(find "$dest/usr/bin" -name gpunodectl -type f | head -n1)
[ -x "$ctl" ] || fail "meson install did not install gpunodectl under /usr/bin"
ctl=${ctl#"$dest"}
log "installed with meson install --destdir"

# What an administrator adds: the config (simulated node, fixture pci.ids) and, for the test only,
# a drop-in with a short watchdog.
mkdir -p "$WORK/e2e"
cat >"$WORK/e2e/agent.yaml" <<EOF
# e2e: read the simulated $NODE node instead of this machine's /sys and /proc
paths:
  sys: /srv/node/sys
  proc: /srv/node/proc
  dev: /srv/node/dev
  pci-ids: /srv/pci.ids
nvml:
  library: /srv/fake-nvml/libnvidia-ml.so.1
# The container's device cgroup forbids mknod of NVIDIA majors; the devices stage is covered by the
# integration suite (integration-devfab), which runs as root outside a container.
devices:
  enabled: false
cdi:
  driver-root: /srv/node
# The consumers stage under the unit's sandbox: Slurm's lines in /etc/slurm, the GPU Operator's
# driver-ready in /run/nvidia/validations (ReadWritePaths=, tmpfiles.d).
gres:
  slurm:
    enabled: true
validations:
  operator-compat: true
# The node_exporter textfile where Debian's prometheus-node-exporter reads it (ReadWritePaths=).
metrics:
  textfile: /var/lib/prometheus/node-exporter/gpu-node-agent.prom
log:
  level: debug
EOF
# Stand-ins for the driver's daemons: the fabric stage starts them through systemd's D-Bus API (and, on
# this NVSwitch node, waits for nvidia-fabricmanager).
for unit in nvidia-persistenced nvidia-fabricmanager; do
        cat >"$WORK/e2e/$unit.service" <<EOF
[Unit]
Description=e2e stand-in for $unit
[Service]
ExecStart=/bin/sleep infinity
EOF
done
cat >"$WORK/e2e/50-e2e.conf" <<'EOF'
# e2e: a short watchdog so the SIGSTOP check takes seconds; leak checking off because LeakSanitizer
# needs ptrace, which SystemCallFilter= forbids (harmless in a non-sanitized build).
[Service]
WatchdogSec=3s
Environment=ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The fake NVML (tests/fakes) stands in for the driver: the node's GPUs, its state in our StateDirectory.
Environment=FAKE_NVML_DESCRIPTION=/srv/node/nvml.yaml FAKE_NVML_STATE=/var/lib/gpu-node-agent/fake-nvml.state FAKE_NVML_PROFILES=/srv/fake-nvml/mig-profiles.yaml
EOF
# A volatile /etc makes this a first boot, on which systemd applies the presets (Debian: "enable *")
# and would start the agent before it is configured. Enabling is the test's job, as it is the job of
# the package's postinst.
echo "disable $UNIT" >"$WORK/e2e/00-e2e.preset"

# ---- boot ----
# A machine name of our own: nspawn keeps per-machine state under /run/systemd/nspawn/, and the
# normal and the sanitizer build may run this test at the same time.
systemd-nspawn --boot --register=no --keep-unit --quiet --console=pipe \
        -D / --volatile=yes --machine="gna-e2e-$$" \
        --overlay-ro="/usr:$dest/usr:/usr" \
        --bind-ro="$node_dir:/srv/node" \
        --bind-ro="$GNA_FIXTURE_PCI_IDS:/srv/pci.ids" \
        --bind-ro="$GNA_FAKE_NVML:/srv/fake-nvml/libnvidia-ml.so.1" \
        --bind-ro="$GNA_SOURCE_ROOT/tests/fixtures/mig-profiles.yaml:/srv/fake-nvml/mig-profiles.yaml" \
        --bind-ro="$WORK/e2e:/srv/e2e" \
        --bind-ro=/dev/null:/etc/systemd/system/systemd-firstboot.service \
        --bind-ro="$WORK/e2e/00-e2e.preset:/etc/systemd/system-preset/00-e2e.preset" \
        </dev/null >"$WORK/console.log" 2>&1 &
NS=$!

# The container's PID 1 is the child of nspawn whose name is systemd (read from /proc: no procps).
find_init() {
        local stat c ppid
        for stat in /proc/[0-9]*/stat; do
                c=${stat#/proc/}; c=${c%/stat}
                ppid=$(awk '{ sub(/^.*\) /, ""); print $2 }' "$stat" 2>/dev/null) || continue
                [ "$ppid" = "$NS" ] || continue
                [ "$(cat "/proc/$c/comm" 2>/dev/null)" = systemd ] && { CT=$c; return 0; }
        done
        return 1
}
wait_until 20 find_init || fail "systemd-nspawn did not start systemd in the container (no child of nspawn pid $NS named systemd)"
wait_until 20 test -S "/proc/$CT/root/run/systemd/private" || fail "the container's systemd did not come up"
state=$(in_ct systemctl is-system-running --wait)
log "container booted: $state"
if [ "$state" != running ]; then
        echo "note: failed units in the container (not ours):"
        in_ct systemctl --failed --no-pager --no-legend
fi

# tmpfiles.d created our directories at boot, before the service ever ran.
in_ct test -d /run/gpu-node-agent || fail "/run/gpu-node-agent missing after boot: tmpfiles.d/gpu-node-agent.conf not applied"
in_ct test -d /var/lib/gpu-node-agent || fail "/var/lib/gpu-node-agent missing after boot: tmpfiles.d/gpu-node-agent.conf not applied"
in_ct test ! -e "$NFD_DIR/features.d" || fail "$NFD_DIR/features.d exists before the agent ran"
active=$(in_ct systemctl is-active "$UNIT")
[ "$active" = inactive ] || fail "$UNIT is '$active' before the test enabled it (started at boot?)"

# ---- provision and start ----
in_ct install -D -m 0644 /srv/e2e/agent.yaml /etc/gpu-node-agent/agent.yaml || fail "cannot write agent.yaml"
in_ct install -D -m 0644 /srv/e2e/50-e2e.conf "/etc/systemd/system/$UNIT.d/50-e2e.conf" || fail "cannot write the drop-in"
# NFD's directory exists but features.d does not: the agent must create it (ReadWritePaths= allows it).
in_ct mkdir -p "$NFD_DIR" || fail "cannot create $NFD_DIR"
# As slurmd's package leaves it; the unit may write below it only when it exists at start.
in_ct mkdir -p /etc/slurm || fail "cannot create /etc/slurm"
# As prometheus-node-exporter's package leaves it.
in_ct mkdir -p /var/lib/prometheus/node-exporter || fail "cannot create /var/lib/prometheus/node-exporter"
in_ct test -d /run/nvidia/validations || fail "/run/nvidia/validations missing after boot: tmpfiles.d/gpu-node-agent.conf not applied"
for unit in nvidia-persistenced nvidia-fabricmanager; do
        in_ct install -m 0644 "/srv/e2e/$unit.service" "/etc/systemd/system/$unit.service" || fail "cannot install $unit.service"
done
in_ct systemctl daemon-reload || fail "systemctl daemon-reload failed"

out=$(in_ct systemctl enable --now "$UNIT" 2>&1) || fail "systemctl enable --now $UNIT failed: $out"
log "systemctl enable --now returned (READY=1 received)"

# ---- what an operator sees ----
active=$(in_ct systemctl is-active "$UNIT")
[ "$active" = active ] || fail "$UNIT is '$active', expected 'active'"
in_ct test -L "/etc/systemd/system/multi-user.target.wants/$UNIT" || fail "enable did not hook $UNIT into multi-user.target"

status_text=$(in_ct systemctl show -P StatusText "$UNIT")
[ -n "$status_text" ] || fail "StatusText of $UNIT is empty: the daemon sends no STATUS="
log "StatusText: $status_text"

out=$(in_ct "$ctl" wait-ready --timeout 30 2>&1) || fail "gpunodectl wait-ready --timeout 30 failed: $out"

prop() { in_ct busctl --system get-property "$BUS_NAME" "$BUS_PATH" "$BUS_IFACE" "$1"; }
ready=$(prop Ready) || fail "busctl get-property Ready failed on the container's system bus"
[ "$ready" = "b true" ] || fail "Ready is '$ready', expected 'b true'"
count=$(prop GpuCount) || fail "busctl get-property GpuCount failed"
[[ "$count" =~ ^[uiqn]\ $NODE_GPUS$ ]] || fail "GpuCount is '$count', expected $NODE_GPUS GPUs of the $NODE node"
state=$(prop State) || fail "busctl get-property State failed"
[ "$state" = 's "ready"' ] || fail "State is '$state', expected 's \"ready\"'"
log "D-Bus: Ready=$ready GpuCount=$count State=$state"

# The name belongs to the unit (BusName=) and is not available to anyone else.
owner_unit=$(in_ct busctl --system status "$BUS_NAME" 2>/dev/null | sed -n 's/^Unit=//p')
[ "$owner_unit" = "$UNIT" ] || fail "$BUS_NAME is owned by unit '$owner_unit', expected $UNIT"

features=$(in_ct cat "$FEATURE_FILE") || fail "the NFD feature file $FEATURE_FILE was not written"
grep -qx "nvidia.com/gpu.present=true" <<<"$features" || fail "$FEATURE_FILE lacks nvidia.com/gpu.present=true: $features"
grep -qx "nvidia.com/gpu.count=$NODE_GPUS" <<<"$features" || fail "$FEATURE_FILE lacks nvidia.com/gpu.count=$NODE_GPUS: $features"
in_ct test -f /run/gpu-node-agent/ready || fail "/run/gpu-node-agent/ready was not written"
grep -qx "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" <<<"$features" || fail "$FEATURE_FILE lacks the NVML product name (nvml stage?): $features"
# The installed vendor default (labels.expiry: 1h): labels of an agent stopped for good expire.
grep -q "^# +expiry-time=" <<<"$features" || fail "$FEATURE_FILE has no expiry directive (vendor default labels.expiry): $features"
gres=$(in_ct cat /etc/slurm/gres-gpu-node-agent.conf) || fail "the Slurm GRES file was not written under the unit's sandbox (ReadWritePaths=/etc/slurm?)"
[ "$(grep -c '^Name=gpu Type=nvidia_h100_80gb_hbm3 File=/srv/node/dev/nvidia[0-7] Cores=' <<<"$gres")" = "$NODE_GPUS" ] ||
        fail "/etc/slurm/gres-gpu-node-agent.conf does not list the $NODE_GPUS GPUs: $gres"
ready_file=$(in_ct cat /run/nvidia/validations/driver-ready) || fail "driver-ready was not written under the unit's sandbox (ReadWritePaths=/run/nvidia?)"
grep -qx "IS_HOST_DRIVER=true" <<<"$ready_file" || fail "driver-ready is not the operator's host-driver format: $ready_file"
spec=$(in_ct cat /run/cdi/nvidia.yaml) || fail "the CDI spec /run/cdi/nvidia.yaml was not written (ReadWritePaths=/run/cdi, tmpfiles?)"
grep -q "kind: nvidia.com/gpu" <<<"$spec" || fail "/run/cdi/nvidia.yaml is not our spec: $spec"
prom=$(in_ct cat /var/lib/prometheus/node-exporter/gpu-node-agent.prom) ||
        fail "the metrics textfile was not written under the unit's sandbox (ReadWritePaths=/var/lib/prometheus/node-exporter?)"
grep -q '^gpu_node_agent_' <<<"$prom" || fail "the metrics textfile has no gpu_node_agent_* series: $prom"
log "feature file, CDI spec, ready file and metrics textfile present"
for unit in nvidia-fabricmanager nvidia-persistenced; do
        [ "$(in_ct systemctl is-active "$unit")" = active ] || fail "the fabric stage did not start $unit"
done
log "fabric stage started nvidia-fabricmanager and nvidia-persistenced over systemd's D-Bus API"

# ---- reload: same process, still active ----
pid=$(in_ct systemctl show -P MainPID "$UNIT")
in_ct systemctl reload "$UNIT" || fail "systemctl reload $UNIT failed"
wait_until 10 unit_active || fail "$UNIT is not active after reload"
[ "$(in_ct systemctl show -P MainPID "$UNIT")" = "$pid" ] || fail "reload replaced the main process instead of reloading it"

# ---- watchdog: a hung daemon is killed and restarted ----
in_ct kill -STOP "$pid" || fail "cannot SIGSTOP the main process $pid"
log "SIGSTOP sent to main PID $pid (WatchdogSec=3s)"
restarted() {
        local n p
        n=$(in_ct systemctl show -P NRestarts "$UNIT") && p=$(in_ct systemctl show -P MainPID "$UNIT") &&
                [ "$n" -ge 1 ] && [ "$p" != 0 ] && [ "$p" != "$pid" ]
}
# systemd SIGABRTs the whole cgroup and waits for it to empty before the restart: give a loaded
# machine time (the NVML worker must go too).
wait_until 60 restarted || fail "systemd did not restart $UNIT within 60 s after its watchdog expired"
journal=$(in_ct journalctl -b --no-pager -u "$UNIT")
grep -q "Watchdog timeout" <<<"$journal" || fail "$UNIT was restarted, but not by the watchdog"
out=$(in_ct "$ctl" wait-ready --timeout 30 2>&1) || fail "gpunodectl wait-ready after the watchdog restart failed: $out"
active=$(in_ct systemctl is-active "$UNIT")
[ "$active" = active ] || fail "$UNIT is '$active' after the watchdog restart"
log "watchdog restart: new main PID $(in_ct systemctl show -P MainPID "$UNIT"), ready again"

# ---- stop: SIGTERM exits cleanly ----
in_ct systemctl stop "$UNIT" || fail "systemctl stop $UNIT failed"
result=$(in_ct systemctl show -P Result "$UNIT")
[ "$result" = success ] || fail "stopping $UNIT ended with Result=$result, expected success (clean exit on SIGTERM)"

# systemd itself had nothing to complain about in our unit (sandboxing it could not set up, bad
# settings) beyond the watchdog kill we caused.
complaints=$(in_ct journalctl -b --no-pager -p warning -o cat _PID=1 UNIT="$UNIT" |
        grep -v -e "Watchdog timeout" -e "code=killed, status=6/ABRT" -e "Failed with result 'watchdog'")
[ -z "$complaints" ] || fail "systemd logged warnings about $UNIT: $complaints"
log "PASS ($NODE: $NODE_GPUS GPUs) in $(elapsed) s"
