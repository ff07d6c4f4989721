#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Owns what the systemd boots of the real-kernel suite (run-vm-systemd-test.sh) give the guest:
#  - LAYER/usr: laid over the host's /usr in the guest (9p share "gnalayer", read-only there, under a
#    tmpfs upper layer): what `meson install --destdir` installed under /usr, the guest kernels'
#    module trees (/usr/lib/modules/<K>, <K2> with K2's headers in /usr/src), and the stand-in
#    NVIDIA DKMS source as its package installs it (/usr/src/nvidia-current-<ver>);
#  - one initramfs per kernel: busybox, init-systemd, the 9p/overlay modules of that kernel, and the
#    guest's / seed: a minimal /etc (no host services, no host secrets; what `meson install` puts in
#    /etc; the test unit gna-vm-test.service enabled), /var, and /gna (guest-systemd.sh, the
#    simulated node's PCI tree, pci.ids).
#
#   mkroot-systemd.sh WORK K KDIR K2 K2DIR DESTDIR FIXTURE_NODE PCI_IDS [NVDIR]
#
# WORK/layer and WORK/initramfs-<release>.cpio.gz are (re)made; DESTDIR is a `meson install
# --destdir`; KDIR/K2DIR come from setup-systemd.sh (K2 may be empty); NVDIR from setup-nvidia.sh.
set -euo pipefail
export PATH=/usr/sbin:/sbin:$PATH

work=$1 K=$2 kdir=$3 K2=$4 k2dir=$5 dest=$6 node=$7 pciids=$8 nvdir=${9:-}
src=$(cd "$(dirname "$0")" && pwd)

# --- the /usr layer --------------------------------------------------------------------------------
layer=$work/layer
rm -rf "$layer"
mkdir -p "$layer/usr/src"
cp -a "$dest/usr/." "$layer/usr/"
cp -al "$kdir/usr/." "$layer/usr/"
[ -z "$K2" ] || cp -al "$k2dir/usr/." "$layer/usr/"
ver=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' "$src/dkms-src/dkms.conf")
# The guest builds it several times under TCG (15x slower than the host), so its copy is trimmed to
# the three modules the driver stage needs: no nvidia-peermem and no peermem stub (driver.peermem: off),
# and no clean step.
p=$layer/usr/src/nvidia-current-$ver
cp -r "$src/dkms-src" "$p"
rm -rf "$p/stub" "$p/peermem.c"
sed -i 's/ nvidia-peermem\.o//; /^nvidia-peermem-objs/d' "$p/Kbuild"
sed -i -e '/^BUILT_MODULE_NAME\[[34]\]/d' -e '/^BUILT_MODULE_LOCATION\[[34]\]/d' \
        -e '/^DEST_MODULE_NAME\[[34]\]/d' -e '/^DEST_MODULE_LOCATION\[[34]\]/d' \
        -e 's| && make -C ${kernel_source_dir} M=${dkms_tree}/${PACKAGE_NAME}/${PACKAGE_VERSION}/build/stub modules||' \
        -e 's|; make -C ${kernel_source_dir} M=${dkms_tree}/${PACKAGE_NAME}/${PACKAGE_VERSION}/build/stub clean||' \
        -e 's|^CLEAN=.*|CLEAN="true"|' "$p/dkms.conf"
# CLEAN="true" as NVIDIA's own dkms.conf has it: dkms copies the source into a fresh build directory
# for each build anyway, and each "make clean" costs a parse of the kernel's Makefiles, 5-10 s under
# TCG, twice per build.
# The GSP firmware files the stand-in nvidia names (the agent checks firmware= before loading).
while read -r fw; do
        mkdir -p "$layer/usr/lib/firmware/$(dirname "$fw")"
        echo "stand-in firmware" >"$layer/usr/lib/firmware/$fw"
done < <(sed -n 's/^MODULE_FIRMWARE("\(.*\)");$/\1/p' "$src/dkms-src/nv.c")
[ -n "$(ls -A "$layer/usr/lib/firmware" 2>/dev/null)" ] || { echo "mkroot-systemd: no MODULE_FIRMWARE in dkms-src/nv.c" >&2; exit 1; }

# The real driver (setup-nvidia.sh): the modules dkms built on the host (the guest copies them into
# /lib/modules/<K>/updates/dkms, where Debian's dkms installs them), firmware-nvidia-gsp's firmware and
# nvidia-kernel-support's files (/etc/nvidia/current, linked into /etc/modprobe.d by the guest as
# nvidia-alternative's update-alternatives does).
if [ -n "$nvdir" ]; then
        mkdir -p "$layer/usr/lib/gna-nvidia/ko"
        cp "$nvdir"/ko/*.ko "$layer/usr/lib/gna-nvidia/ko/"
        [ ! -d "$nvdir/root/usr/lib/firmware" ] || cp -a "$nvdir/root/usr/lib/firmware" "$layer/usr/lib/"
        [ ! -d "$nvdir/root/lib/firmware" ] || cp -a "$nvdir/root/lib/firmware" "$layer/usr/lib/"
fi

# --- the / seed ------------------------------------------------------------------------------------
seed=$work/rootfs
rm -rf "$seed"
mkdir -p "$seed"/{etc,var/lib/dkms,var/log,var/tmp,var/cache,tmp,root,gna/empty,etc/modprobe.d,etc/systemd/system/multi-user.target.wants}
chmod 1777 "$seed/tmp" "$seed/var/tmp"
[ ! -d "$dest/etc" ] || cp -a "$dest/etc/." "$seed/etc/"
for f in passwd group nsswitch.conf ld.so.conf ld.so.cache login.defs; do
        [ ! -e "/etc/$f" ] || cp -a "/etc/$f" "$seed/etc/"
done
for d in alternatives dkms ld.so.conf.d dbus-1 kernel; do
        [ ! -d "/etc/$d" ] || cp -a "/etc/$d" "$seed/etc/"
done
mkdir -p "$seed/etc/ssl"
[ ! -e /etc/ssl/openssl.cnf ] || cp /etc/ssl/openssl.cnf "$seed/etc/ssl/"
# Only root can log in nowhere: no password hashes from the host.
awk -F: '{ print $1 ":*:19000:0:99999:7:::" }' /etc/passwd >"$seed/etc/shadow"
chmod 0640 "$seed/etc/shadow"
echo 0123456789abcdef0123456789abcdef >"$seed/etc/machine-id"
echo gna-vm >"$seed/etc/hostname"
ln -sf ../usr/lib/os-release "$seed/etc/os-release"
ln -sf ../proc/self/mounts "$seed/etc/mtab"
: >"$seed/etc/fstab"
[ -z "$nvdir" ] || cp -a "$nvdir/root/etc/nvidia" "$seed/etc/"
# Nothing that only slows the boot or grabs the console.
for u in serial-getty@ttyS0.service getty@tty1.service systemd-firstboot.service; do
        ln -sf /dev/null "$seed/etc/systemd/system/$u"
done
cat >"$seed/etc/systemd/system/gna-vm-test.service" <<'EOF'
[Unit]
Description=gpu-node-agent real-kernel checks (tests/vm/guest-systemd.sh)
After=dbus.service systemd-tmpfiles-setup.service systemd-modules-load.service
Wants=dbus.service

[Service]
Type=oneshot
ExecStart=/bin/bash /gna/guest-systemd.sh
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
EOF
ln -sf ../gna-vm-test.service "$seed/etc/systemd/system/multi-user.target.wants/gna-vm-test.service"
install -m 0755 "$src/guest-systemd.sh" "$seed/gna/guest-systemd.sh"
cp -a "$node/sys" "$seed/gna/sys"
rm -rf "$seed/gna/sys/module" "$seed/gna/sys/kernel/security"
ln -s /sys/module "$seed/gna/sys/module"
mkdir -p "$seed/gna/sys/kernel"
ln -s /sys/kernel/security "$seed/gna/sys/kernel/security"
cp "$pciids" "$seed/gna/pci.ids"

# --- one initramfs per kernel ----------------------------------------------------------------------
mkinitramfs() { # RELEASE KERNEL_CACHE_DIR PHASE
        local rel=$1 d=$2 phase=$3 stage
        stage=$(mktemp -d "${TMPDIR:-/tmp}/gna-initramfs-sd.XXXXXX")
        mkdir -p "$stage"/{bin,dev,proc,sys,mods,newroot,gna/usr}
        cp /bin/busybox "$stage/bin/busybox"
        ln -s busybox "$stage/bin/sh"
        install -m 0755 "$src/init-systemd" "$stage/init"
        cp "$d"/boot-modules/*.ko "$d/boot-modules/order" "$stage/mods/"
        cp -a "$seed" "$stage/gna/rootfs"
        cat >"$stage/gna/test.env" <<EOF
PHASE='$phase'
K='$K'
K2='$K2'
DKMS_VERSION='$ver'
NVIDIA='${nvdir:+$(cat "$nvdir/version")}'
EOF
        (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) \
                >"$work/initramfs-$rel.cpio.gz"
        rm -rf "$stage"
}
mkinitramfs "$K" "$kdir" 1
[ -z "$K2" ] || mkinitramfs "$K2" "$k2dir" 2
