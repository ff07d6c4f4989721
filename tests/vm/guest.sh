# SPDX-License-Identifier: MIT
# Owns the checks that run inside the VM (busybox sh, started by /init). It drives the real kernel
# through the agent's driver stage (`gpu-node-agent --oneshot`) or, while that stage is not wired
# yet, through the same module library via vm-modctl's "stage" command, and checks what the kernel
# then shows in /sys/module and dmesg, plus the words the user gets. Lines for the host:
#   GNA-VM: MODE agent|lib <why>
#   GNA-VM: PASS <check>            GNA-VM: FAIL <check>: <what was wrong>
#   GNA-VM: LOG <text>              output of the agent/helper, for diagnosis
# Which checks run depends on the kernel command line: module.sig_enforce=1 → signature checks;
# lockdown=integrity → lockdown checks; gna.seq=real → Debian's real driver; gna.seq=open → Debian's
# real open kernel modules; otherwise the main sequence. The host (run-vm-test.sh)
# knows the list of checks each boot must report as passed.
. /gna/expect.env

MODCTL_ARGS="--sys=/gna/sys --config=/etc/modprobe.d --firmware=/lib/firmware"
n=0

say() { echo "GNA-VM: $*"; }
pass() { say "PASS $1"; }
fail() { say "FAIL $1: $2"; }
# check NAME DESCRIPTION COMMAND...: PASS when COMMAND succeeds.
check() {
        name=$1 what=$2
        shift 2
        if "$@"; then pass "$name"; else fail "$name" "$what"; fi
}
# The agent's debug output minus libkmod's own chatter (index lookups), which would drown the rest.
show() { grep -v 'libkmod: ' "$2" | sed "s/^/GNA-VM: LOG $1: /"; }

live() { [ "$(cat /sys/module/$1/initstate 2>/dev/null)" = live ]; }
absent() { [ ! -e /sys/module/$1 ]; }
param() { cat /sys/module/$1/parameters/$2 2>/dev/null; }
has() { grep -qF -- "$2" "$1"; }
dmesg_count() { dmesg | grep -cF -- "$1"; }
# dmesg_before A B: the first line containing A comes before the first containing B.
dmesg_before() {
        a=$(dmesg | grep -nF -- "$1" | head -n1 | cut -d: -f1)
        b=$(dmesg | grep -nF -- "$2" | head -n1 | cut -d: -f1)
        [ -n "$a" ] && [ -n "$b" ] && [ "$a" -lt "$b" ]
}
modctl() {
        tree=$1
        shift
        vm-modctl --modules=/gna/trees/$tree/lib/modules/$K $MODCTL_ARGS "$@"
}

# The agent's configuration for a module tree: the simulated node's PCI devices, the real module
# state, the stand-ins' options, and nothing else of the agent's work (no GPU, no NVML, no dbus).
write_config() {
        cat >/tmp/agent-$1.yaml <<EOF
paths:
  sys: /gna/sys
  modules: /gna/trees/$1/lib/modules
  pci-ids: /gna/pci.ids
  state: /tmp/gna-state
  run: /run
driver:
  modeset: true
  peermem: auto
  parameters:
    nvidia: "$2"
    nvidia-uvm: "uvm_disable_hmm=1"
  dkms:
    enabled: false
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

# drive TREE NVIDIA_OPTIONS: one pass of the driver stage; output in $out.
drive() {
        n=$((n + 1))
        out=/tmp/drive-$n.log
        if [ "$MODE" = agent ]; then
                write_config "$1" "$2"
                gpu-node-agent -c /tmp/agent-$1.yaml --config-dir=/gna/empty --oneshot --log-level=debug >"$out" 2>&1
        else
                modctl "$1" stage --modeset --peermem --mlx "--param=nvidia=$2" --param=nvidia-uvm=uvm_disable_hmm=1 >"$out" 2>&1
        fi
        show "drive $n ($1)" "$out"
}

# Agent when its driver stage does real work, else the library through vm-modctl.
pick_mode() {
        if grep -q 'gna.mode=lib' /proc/cmdline; then
                MODE=lib
                say "MODE lib (gna.mode=lib on the kernel command line)"
                return
        fi
        write_config main ""
        # A tree with no modules at all: the probe runs, the driver stage fails or says it is
        # not implemented, and nothing gets loaded by this detection run.
        mkdir -p /tmp/none/lib/modules/$K
        sed "s|/gna/trees/main/lib/modules|/tmp/none/lib/modules|" /tmp/agent-main.yaml >/tmp/agent-none.yaml
        gpu-node-agent -c /tmp/agent-none.yaml --config-dir=/gna/empty --oneshot --log-level=debug >/tmp/detect.log 2>&1
        show detect /tmp/detect.log
        if grep -i 'stage driver' /tmp/detect.log | grep -qi 'not implemented'; then
                MODE=lib
                say "MODE lib (the agent's driver stage is not implemented yet; the library runs it)"
        else
                MODE=agent
                say "MODE agent"
        fi
}

main_sequence() {
        # 1. Nothing loaded: the stage loads ipmi (best effort), nvidia, nvidia-uvm, nvidia-modeset,
        #    with options from modprobe.d (both file and kernel name) and from driver.parameters.
        drive main NVreg_EnableGpuFirmware=0
        check load-live "nvidia, nvidia_uvm and nvidia_modeset are not all live after the stage" \
                eval 'live nvidia && live nvidia_uvm && live nvidia_modeset'
        check load-ipmi "ipmi_msghandler/ipmi_devintf (best effort, present in the tree) were not loaded" \
                eval 'live ipmi_msghandler && live ipmi_devintf'
        check load-order "dmesg does not show ipmi → nvidia → nvidia-uvm → nvidia-modeset" \
                eval 'dmesg_before "IPMI message handler" "nvidia stand-in: loaded" &&
                      dmesg_before "nvidia stand-in: loaded" "nvidia-uvm stand-in: loaded" &&
                      dmesg_before "nvidia-uvm stand-in: loaded" "nvidia-modeset stand-in: loaded"'
        check options-modprobe-d "modprobe.d options did not reach nvidia (NVreg_DeviceFileMode=$(param nvidia NVreg_DeviceFileMode), NVreg_RegistryDwords=$(param nvidia NVreg_RegistryDwords))" \
                eval '[ "$(param nvidia NVreg_DeviceFileMode)" = 432 ] && [ "$(param nvidia NVreg_RegistryDwords)" = RMTestKey=1 ]'
        check options-config "driver.parameters did not reach the kernel (NVreg_EnableGpuFirmware=$(param nvidia NVreg_EnableGpuFirmware), uvm_disable_hmm=$(param nvidia_uvm uvm_disable_hmm))" \
                eval '[ "$(param nvidia NVreg_EnableGpuFirmware)" = 0 ] && [ "$(param nvidia_uvm uvm_disable_hmm)" = 1 ]'
        check debian-naming "the modules were not loaded from Debian's nvidia-current*.ko files" \
                eval 'modctl main info nvidia >/tmp/info.log && has /tmp/info.log "index=nvidia_current " && has /tmp/info.log "/updates/dkms/nvidia-current.ko"'
        check peermem-waits-ib-core "nvidia-peermem was loaded, or the reason does not say it waits for ib_core" \
                eval 'absent nvidia_peermem && has $out "waits for ib_core"'

        # 2. Already loaded: the normal case on Debian. Nothing is reloaded, old options stay.
        drive main NVreg_EnableGpuFirmware=1
        check fast-path "the second pass reloaded nvidia or changed its options" \
                eval '[ "$(dmesg_count "nvidia stand-in: loaded")" = 1 ] && [ "$(param nvidia NVreg_EnableGpuFirmware)" = 0 ] &&
                      { [ $MODE = agent ] || has $out "step nvidia rc=0 "; }'

        # 3. peermem stub with ib_core live: refused with the rebuild hint; the kernel agrees.
        modctl main load ib_core >/tmp/ib.log 2>&1
        show "load ib_core" /tmp/ib.log
        check ib-core-live "the in-tree ib_core did not load" live ib_core
        drive stub NVreg_EnableGpuFirmware=0
        check peermem-stub-refused "the stub was loaded, or the reason does not say to rebuild against MOFED/ib_core" \
                eval 'absent nvidia_peermem && has $out "rebuild it against the installed MOFED/ib_core"'
        vm-modctl insmod /gna/ko/std/nvidia-current-peermem-stub.ko >/tmp/stub.log 2>&1
        show "insmod stub" /tmp/stub.log
        check peermem-stub-einval "the kernel did not refuse the stub with EINVAL" \
                eval 'has /tmp/stub.log "errno=EINVAL" && absent nvidia_peermem'

        # 4. The real peermem once ib_core is live: loaded, holding ib_core and nvidia.
        drive main NVreg_EnableGpuFirmware=0
        check peermem-loaded "nvidia-peermem (built against ib_core) was not loaded after ib_core" \
                eval 'live nvidia_peermem && [ -e /sys/module/ib_core/holders/nvidia_peermem ] &&
                      [ -e /sys/module/nvidia/holders/nvidia_peermem ]'

        # 5. Unload: the kernel refuses while a holder exists; the library refuses before touching
        #    anything, then removes holders first.
        vm-modctl rmmod nvidia >/tmp/rmmod.log 2>&1
        show "rmmod nvidia" /tmp/rmmod.log
        check unload-kernel-eagain "delete_module(nvidia) with holders did not fail with EAGAIN" \
                eval 'has /tmp/rmmod.log "errno=EAGAIN" && live nvidia'
        modctl main unload nvidia >/tmp/unload1.log 2>&1
        show "unload nvidia" /tmp/unload1.log
        check unload-refused "unloading nvidia alone was not refused with its holders listed, or something was removed" \
                eval 'has /tmp/unload1.log "errno=EBUSY" && has /tmp/unload1.log "in use by" &&
                      has /tmp/unload1.log nvidia_uvm && has /tmp/unload1.log nvidia_modeset &&
                      has /tmp/unload1.log nvidia_peermem &&
                      live nvidia && live nvidia_uvm && live nvidia_modeset && live nvidia_peermem'
        modctl main unload nvidia nvidia-uvm nvidia-modeset nvidia-peermem >/tmp/unload2.log 2>&1
        show "unload all" /tmp/unload2.log
        check unload-holder-order "the driver was not removed holders first (or not completely)" \
                eval 'has /tmp/unload2.log "rc=4 " && absent nvidia && absent nvidia_uvm && absent nvidia_modeset &&
                      absent nvidia_peermem && live ib_core &&
                      dmesg_before "nvidia-uvm stand-in: unloaded" "nvidia stand-in: unloaded" &&
                      dmesg_before "nvidia-modeset stand-in: unloaded" "nvidia stand-in: unloaded" &&
                      dmesg_before "nvidia-peermem stand-in: unloaded" "nvidia stand-in: unloaded"'

        # 6. Built against other headers: the kernel says ENOEXEC and the user is told to rebuild.
        drive enoexec NVreg_EnableGpuFirmware=0
        check enoexec-reported "the ENOEXEC failure was not reported with the DKMS rebuild command" \
                eval 'absent nvidia && has $out "ENOEXEC" && has $out "dkms autoinstall -k $K"'
        vm-modctl insmod /gna/ko/enoexec/nvidia-current.ko >/tmp/enoexec.log 2>&1
        show "insmod enoexec" /tmp/enoexec.log
        check enoexec-kernel "the kernel did not refuse the other headers' module with ENOEXEC" \
                has /tmp/enoexec.log "errno=ENOEXEC"

        # 7. A vermagic naming another release, the rest equal to the running kernel's: the kernel
        #    takes it (MODVERSIONS), and so does the agent (as RHEL's weak-updates need).
        vm-modctl insmod /gna/ko/release/nvidia-current.ko >/tmp/release.log 2>&1
        show "insmod release" /tmp/release.log
        check vermagic-kernel-accepts "the kernel refused a module whose vermagic differs only in the release" \
                eval 'has /tmp/release.log "rc=0 " && live nvidia'
        vm-modctl rmmod nvidia >/dev/null 2>&1
        drive release NVreg_EnableGpuFirmware=0
        check vermagic-accepted "the module built for $OTHER_RELEASE (vermagic otherwise the kernel's) was refused" \
                eval 'live nvidia && ! has $out "was built for kernel $OTHER_RELEASE, not the running $K"'
        modctl main unload nvidia nvidia-uvm nvidia-modeset nvidia-peermem >/dev/null 2>&1

        # 8. modprobe.d as modprobe honours it (Debian's install lines are in /etc/modprobe.d/nvidia.conf
        #    throughout): an administrator's install command, a softdep, a blacklist, a typo.
        # modprobe takes the first install line for a name, in file name order: the administrator's
        # file must sort before Debian's nvidia.conf.
        echo "install nvidia /bin/false" >/etc/modprobe.d/00-admin.conf
        drive main NVreg_EnableGpuFirmware=0
        check install-false-honoured "\"install nvidia /bin/false\" was not honoured (or not reported)" \
                eval 'absent nvidia && absent nvidia_uvm && has $out "install nvidia /bin/false"'
        modctl main unload nvidia nvidia-uvm nvidia-modeset nvidia-peermem >/dev/null 2>&1
        rm -f /etc/modprobe.d/00-admin.conf
        echo "softdep nvidia-current pre: ipmi_devintf post: nvidia-current-uvm" >/etc/modprobe.d/zz-admin.conf
        modctl main unload ipmi_devintf >/dev/null 2>&1
        dmesg -c >/dev/null
        modctl main load nvidia >/tmp/softdep.log 2>&1
        show "load nvidia with softdeps" /tmp/softdep.log
        check softdep-pre-post "softdep pre:/post: written for the Debian file names were not applied in order" \
                eval 'live ipmi_devintf && live nvidia && live nvidia_uvm && absent nvidia_modeset &&
                      dmesg_before "nvidia stand-in: loaded" "nvidia-uvm stand-in: loaded"'
        modctl main unload nvidia nvidia-uvm nvidia-modeset nvidia-peermem >/dev/null 2>&1
        echo "blacklist nvidia" >/etc/modprobe.d/zz-admin.conf
        drive main NVreg_EnableGpuFirmware=0
        check blacklist-ignored "a blacklist line kept nvidia from an explicit load (modprobe loads it)" live nvidia
        # An administrator's remove command is honoured as modprobe -r honours it (Debian's own
        # "modprobe -r -i …" remove lines are in nvidia.conf throughout and do not get in the way).
        echo "remove nvidia /bin/false" >/etc/modprobe.d/00-admin.conf
        modctl main unload nvidia nvidia-uvm nvidia-modeset nvidia-peermem >/tmp/unload3.log 2>&1
        show "unload with remove /bin/false" /tmp/unload3.log
        check remove-false-honoured "\"remove nvidia /bin/false\" was not honoured (or not reported)" \
                eval 'live nvidia && has /tmp/unload3.log "remove nvidia /bin/false"'
        rm -f /etc/modprobe.d/00-admin.conf
        modctl main unload nvidia nvidia-uvm nvidia-modeset nvidia-peermem >/dev/null 2>&1
        rm -f /etc/modprobe.d/zz-admin.conf
        drive main NVreg_EnableGpuFirmwar=0
        check unknown-parameter "a parameter nvidia does not have was not refused by name" \
                eval 'absent nvidia && has $out "no parameter \"NVreg_EnableGpuFirmwar\""'
}

sig_enforce_sequence() {
        check sig-enforce-on "module.sig_enforce=1 is not in effect" \
                eval '[ "$(cat /sys/module/module/parameters/sig_enforce)" = Y ]'
        modctl main load ib_core >/tmp/ib.log 2>&1
        show "load ib_core" /tmp/ib.log
        check sig-intree-loads "the distribution-signed ib_core did not load under sig_enforce" live ib_core
        drive main NVreg_EnableGpuFirmware=0
        check sig-rejected "EKEYREJECTED was not reported with the signer and the key to enroll" \
                eval 'absent nvidia && has $out "mokutil --import /var/lib/dkms/mok.pub" &&
                      has $out "\"$SIGNER\"" && has $out "$SIG_KEY"'
        vm-modctl insmod /gna/ko/std/nvidia-current.ko >/tmp/sig.log 2>&1
        show "insmod signed" /tmp/sig.log
        check sig-kernel "the kernel did not reject the DKMS-signed module with EKEYREJECTED" \
                has /tmp/sig.log "errno=EKEYREJECTED"
}

lockdown_sequence() {
        check lockdown-on "lockdown=integrity is not in effect" \
                grep -qF '[integrity]' /sys/kernel/security/lockdown
        drive main NVreg_EnableGpuFirmware=0
        check lockdown-reported "EPERM under lockdown was not reported as lockdown with the key to enroll" \
                eval 'absent nvidia && has $out "locked down (integrity)" && has $out "mokutil --import"'
        vm-modctl insmod /gna/ko/std/nvidia-current.ko >/tmp/ld.log 2>&1
        show "insmod lockdown" /tmp/ld.log
        check lockdown-kernel "the kernel did not refuse the DKMS-signed module with EPERM" \
                has /tmp/ld.log "errno=EPERM"
}

# Debian's real nvidia-current (the proprietary 535 driver from nvidia-kernel-dkms), with Debian's own
# modprobe.d files. The guest has no GPU: the module's init fails with ENODEV ("NVRM: No NVIDIA GPU
# found"), which the agent must say as such, with the PCI state it sees (the dgx-h100-noload fixture:
# GPUs without a driver).
real_sequence() {
        . /gna/real.env
        vm-modctl --modules=/gna/trees/real/lib/modules/$K --sys=/gna/sys-noload --config=/gna/real-etc/modprobe.d \
                --firmware=/lib/firmware info nvidia >/tmp/real-info.log 2>&1
        show "real modinfo" /tmp/real-info.log
        check real-modinfo "the real module's modinfo (version, vermagic, firmware, softdep, flavour) was not read as modinfo reads it" \
                eval 'has /tmp/real-info.log "index=nvidia_current " && has /tmp/real-info.log "version=$REAL_VERSION " &&
                      has /tmp/real-info.log "vermagic=$REAL_VERMAGIC" && has /tmp/real-info.log "firmware=$REAL_FIRMWARE" &&
                      { [ -z "$REAL_SOFTDEP" ] || has /tmp/real-info.log "softdep=$REAL_SOFTDEP"; } &&
                      has /tmp/real-info.log "license=$REAL_LICENSE open=no"'
        cat >/tmp/agent-real.yaml <<EOF
paths:
  sys: /gna/sys-noload
  etc: /gna/real-etc
  modules: /gna/trees/real/lib/modules
  pci-ids: /gna/pci.ids
  state: /tmp/gna-state-real
  run: /run
driver:
  parameters:
    nvidia: "NVreg_EnableGpuFirmware=0"
  dkms:
    enabled: false
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
        out=/tmp/real-drive.log
        dmesg -c >/dev/null
        gpu-node-agent -c /tmp/agent-real.yaml --config-dir=/gna/empty --oneshot --log-level=debug >"$out" 2>&1
        show "drive real" "$out"
        dmesg | sed 's/^/GNA-VM: LOG dmesg: /' | grep -i nvrm
        check real-debian-conf "Debian's install line (modprobe -i nvidia-current) did not lead to nvidia-current.ko" \
                has "$out" "/updates/dkms/nvidia-current.ko with options"
        check real-enodev "the real module's ENODEV was not reported as no GPU bound, with the PCI state" \
                eval 'absent nvidia && has $out "ENODEV; dmesg: \"NVRM: No NVIDIA GPU found\"" &&
                      has $out "GPUs without a driver: 0000:1b:00.0"'
        check real-enodev-kernel "the kernel did not say NVRM: No NVIDIA GPU found" \
                eval 'dmesg | grep -q "NVRM: No NVIDIA GPU found"'
}

# Debian's real open kernel modules (nvidia-open-kernel-dkms 535, files nvidia-current-open*.ko) with
# nvidia-open-kernel-support's modprobe.d files and firmware-nvidia-gsp's firmware, as installed. The
# agent chooses the flavour from driver.kernel-module-type; the open module's init fails with ENODEV
# without a GPU, as the proprietary one's does.
open_config() {
        cat >/tmp/agent-open-$1.yaml <<EOF
paths:
  root: ${2:-/}
  sys: /gna/sys-noload
  etc: /gna/open-etc
  modules: /gna/trees/open/lib/modules
  pci-ids: /gna/pci.ids
  state: /tmp/gna-state-open-$1
  run: /run
driver:
  kernel-module-type: $1
  dkms:
    enabled: false
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
# open_drive TYPE [ROOT]: one agent pass with driver.kernel-module-type: TYPE (paths.root ROOT); output in $out.
open_drive() {
        open_config "$1" "${2:-}"
        out=/tmp/open-drive-$1${2:+-other-root}.log
        gpu-node-agent -c /tmp/agent-open-$1.yaml --config-dir=/gna/empty --oneshot --log-level=debug >"$out" 2>&1
        show "drive open ($1${2:+, a root without firmware})" "$out"
}
open_sequence() {
        . /gna/open.env
        vm-modctl --modules=/gna/trees/open/lib/modules/$K --sys=/gna/sys-noload --config=/gna/open-etc/modprobe.d \
                --firmware=/lib/firmware info nvidia >/tmp/open-info.log 2>&1
        show "open modinfo" /tmp/open-info.log
        fw_listed=true
        for f in $OPEN_FIRMWARE; do has /tmp/open-info.log "firmware=$f" || fw_listed=false; done
        check open-modinfo "the open module's modinfo (version $OPEN_VERSION, vermagic, firmware $OPEN_FIRMWARE, license \"$OPEN_LICENSE\", open flavour) was not read as modinfo reads it" \
                eval 'has /tmp/open-info.log "index=nvidia_current_open " && has /tmp/open-info.log "version=$OPEN_VERSION " &&
                      has /tmp/open-info.log "/updates/dkms/nvidia-current-open.ko " &&
                      has /tmp/open-info.log "vermagic=$OPEN_VERMAGIC" && [ -n "$OPEN_FIRMWARE" ] && $fw_listed &&
                      has /tmp/open-info.log "license=$OPEN_LICENSE open=yes"'

        # The agent reads the same firmware list: under a root without /lib/firmware it names the
        # first file and the package, and offers no GSP-off way out (the open modules need GSP).
        mkdir -p /tmp/open-nofw
        open_drive open /tmp/open-nofw
        fw1=${OPEN_FIRMWARE%% *}
        check open-firmware-named "without the GSP firmware the agent did not name $fw1 and firmware-nvidia-gsp of $OPEN_VERSION (or offered NVreg_EnableGpuFirmware=0)" \
                eval 'absent nvidia && has $out "needs the firmware file $fw1" && has $out "firmware-nvidia-gsp" &&
                      has $out "driver $OPEN_VERSION" && ! has $out "NVreg_EnableGpuFirmware=0"'

        # Only the open flavour is installed: asking for the proprietary one fails naming its package.
        open_drive proprietary
        check open-proprietary-missing "driver.kernel-module-type: proprietary with only nvidia-current-open installed was not refused naming nvidia-kernel-dkms" \
                eval 'absent nvidia && has $out "nvidia-current-open.ko" && has $out "nvidia-kernel-dkms"'

        dmesg -c >/dev/null
        open_drive open
        check open-chosen "the agent did not say it uses the open modules because driver.kernel-module-type: open" \
                has $out "Using the open kernel modules: driver.kernel-module-type: open"
        check open-debian-conf "Debian's install line (modprobe -i nvidia-current-open) did not lead to nvidia-current-open.ko" \
                has "$out" "/updates/dkms/nvidia-current-open.ko with options"
        check open-enodev "the open module's ENODEV was not reported as no GPU bound to the driver, with the PCI state" \
                eval 'absent nvidia && has $out "nvidia-current-open.ko): its init found no GPU to drive (ENODEV; dmesg: \"NVRM: No NVIDIA GPU found\"), so no NVIDIA GPU is bound to the driver" &&
                      has $out "GPUs without a driver: 0000:1b:00.0"'
        dmesg | grep -i nvrm | sed 's/^/GNA-VM: LOG dmesg: /'
        check open-enodev-kernel "the kernel did not say NVRM: No NVIDIA GPU found for the open module" \
                eval 'dmesg | grep -q "NVRM: No NVIDIA GPU found"'

        # auto on Hopper with only the open modules installed: open, and it says why.
        open_drive auto
        check open-auto "driver.kernel-module-type: auto did not report choosing the open modules because they are the only ones installed" \
                eval 'has $out "Using the open kernel modules (driver.kernel-module-type: auto): the only ones installed" &&
                      has $out "/updates/dkms/nvidia-current-open.ko with options" && has $out "(ENODEV; dmesg"'
}

pick_mode
case " $(cat /proc/cmdline) " in
*" gna.seq=open "*) open_sequence ;;
*" gna.seq=real "*) real_sequence ;;
*" module.sig_enforce=1 "*) sig_enforce_sequence ;;
*" lockdown=integrity "*) lockdown_sequence ;;
*) main_sequence ;;
esac
