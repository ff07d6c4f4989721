#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Owns the real-kernel suite's initramfs: static busybox, /init and guest.sh, the real agent and
# vm-modctl with their ldd closure, the simulated node's PCI tree, module trees for the test cases,
# firmware files the stand-in names, modprobe.d, and the facts the guest checks against.
#
#   mkinitramfs.sh OUT.cpio.gz K KERNEL_DIR MODS_DIR AGENT MODCTL FIXTURE_NODE PCI_IDS
#
# KERNEL_DIR and MODS_DIR come from setup.sh. Guest layout:
#   /gna/sys                  the fixture's sys with module -> /sys/module and kernel/security ->
#                             /sys/kernel/security: paths.sys reads the simulated PCI devices, while
#                             module state and lockdown come from the running kernel
#   /gna/trees/<case>/lib/modules/<K>   depmod'd trees: main (real peermem), stub (peermem stub),
#                             enoexec (nvidia from other headers), release (nvidia whose vermagic names
#                             another release); all with the in-tree ib_core and ipmi modules
#   /gna/ko/<variant>/        the DKMS-built files, for raw finit_module checks
#   /gna/expect.env           K, the DKMS key's signer and key id, the other release
# With REAL (setup.sh's Debian nvidia-current build, optional 9th argument) also:
#   /gna/trees/real/...       the in-tree modules plus Debian's real nvidia-current*.ko
#   /gna/real-etc/modprobe.d  Debian's nvidia-kernel-support files as installed (nvidia.conf, ...)
#   /gna/sys-noload           the dgx-h100-noload node's sys (GPUs without a driver), module state real
#   /gna/real.env             what the host's modinfo says of the real nvidia-current.ko
# With OPEN (setup-nvidia.sh's open build, optional 10th argument), a second archive OUT-open.cpio.gz
# (without the suffix .cpio.gz: OUT minus it, plus -open.cpio.gz) for the boot that appends it to
# OUT (the kernel unpacks concatenated archives in order), so that the other boots do not carry its
# 60 MB of firmware:
#   /gna/trees/open/...       the in-tree modules plus Debian's real nvidia-current-open*.ko
#   /gna/open-etc/modprobe.d  nvidia-open-kernel-support's files as Debian's alternatives install them
#   /lib/firmware/nvidia/<v>/ firmware-nvidia-gsp's GSP firmware (the open modules always need it)
#   /gna/sys-noload           as above
#   /gna/open.env             what the host's modinfo says of the real nvidia-current-open.ko
set -euo pipefail
export PATH=/usr/sbin:/sbin:$PATH

out=$1 K=$2 kdir=$3 mods=$4 agent=$5 modctl=$6 node=$7 pciids=$8 real=${9:-} open=${10:-}
src=$(cd "$(dirname "$0")" && pwd)

stage=$(mktemp -d "${TMPDIR:-/tmp}/gna-initramfs.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/base"
cd "$stage/base"

mkdir -p bin sbin usr/bin usr/sbin proc sys dev run tmp etc/modprobe.d lib/firmware gna/bin gna/ko gna/trees gna/empty
cp /bin/busybox bin/busybox
ln -s busybox bin/sh
install -m 0755 "$src/init" init
install -m 0644 "$src/guest.sh" gna/guest.sh

# Binaries and the libraries they load, at the same paths as on the host.
copy_with_libs() {
        local bin=$1 dest=$2 lib
        install -m 0755 "$bin" "$dest"
        ldd "$bin" | awk '/=> \// { print $3 } /^[[:space:]]*\/[^ ]*ld-linux/ { print $1 }' | while read -r lib; do
                mkdir -p ".$(dirname "$lib")"
                [ -e ".$lib" ] || cp -L "$lib" ".$lib"
        done
}
copy_with_libs "$agent" gna/bin/gpu-node-agent
copy_with_libs "$modctl" gna/bin/vm-modctl

# The simulated node: its PCI devices from the fixture, the kernel's own module state.
cp -a "$node/sys" gna/sys
rm -rf gna/sys/module gna/sys/kernel/security
ln -s /sys/module gna/sys/module
mkdir -p gna/sys/kernel
ln -s /sys/kernel/security gna/sys/kernel/security
cp "$pciids" gna/pci.ids

# The GSP firmware the stand-in nvidia names (the agent checks firmware= files before loading).
ver=$(modinfo -F version "$mods/std/nvidia-current.ko")
while read -r fw; do
        mkdir -p "lib/firmware/$(dirname "$fw")"
        echo "stand-in firmware" >"lib/firmware/$fw"
done < <(modinfo -F firmware "$mods/std/nvidia-current.ko")

for v in std enoexec release; do
        mkdir -p "gna/ko/$v"
        cp "$mods/$v"/*.ko "gna/ko/$v/"
done

# The dgx-h100-noload node's sys (GPUs without a driver), with the running kernel's module state.
noload_sys() {
        cp -a "$(dirname "$node")/dgx-h100-noload/sys" "$1"
        rm -rf "$1/module" "$1/kernel/security"
        ln -s /sys/module "$1/module"
        mkdir -p "$1/kernel"
        ln -s /sys/kernel/security "$1/kernel/security"
}

# Module trees: the in-tree modules from the kernel package, plus the DKMS files as Debian's
# package installs them (updates/dkms/nvidia-current*.ko). Hard links keep one copy of each file.
cp -a "$kdir/lib/modules/$K" gna/kernel
mktree() {
        local name=$1 variant=$2 peermem=$3 t
        t=gna/trees/$name/lib/modules/$K
        mkdir -p "$t/updates/dkms"
        cp -al gna/kernel/. "$t/"
        for f in nvidia-current nvidia-current-uvm nvidia-current-modeset; do
                ln "gna/ko/$variant/$f.ko" "$t/updates/dkms/$f.ko"
        done
        ln "gna/ko/$variant/$peermem.ko" "$t/updates/dkms/nvidia-current-peermem.ko"
        depmod -b "gna/trees/$name" "$K"
}
mktree main std nvidia-current-peermem
mktree stub std nvidia-current-peermem-stub
mktree enoexec enoexec nvidia-current-peermem
mktree release release nvidia-current-peermem
if [ -n "$real" ]; then
        t=gna/trees/real/lib/modules/$K
        mkdir -p "$t/updates/dkms" gna/real-etc/modprobe.d
        cp -al gna/kernel/. "$t/"
        cp "$real"/nvidia-current*.ko "$t/updates/dkms/"
        depmod -b gna/trees/real "$K"
        # As Debian's alternatives install them: /etc/modprobe.d/nvidia.conf is nvidia-modprobe.conf.
        cp "$real/modprobe/nvidia-modprobe.conf" gna/real-etc/modprobe.d/nvidia.conf
        for f in "$real"/modprobe/*.conf; do
                case $(basename "$f") in
                nvidia-modprobe.conf|nvidia-load.conf) ;;
                *) cp "$f" gna/real-etc/modprobe.d/ ;;
                esac
        done
        noload_sys gna/sys-noload
        rko=$real/nvidia-current.ko
        {
                echo "REAL_VERSION='$(modinfo -F version "$rko")'"
                echo "REAL_VERMAGIC='$(modinfo -F vermagic "$rko")'"
                echo "REAL_FIRMWARE='$(modinfo -F firmware "$rko" | head -n1)'"
                echo "REAL_SOFTDEP='$(modinfo -F softdep "$rko" | head -n1)'"
                echo "REAL_LICENSE='$(modinfo -F license "$rko")'"
        } >gna/real.env
fi
if [ -n "$open" ]; then
        # Debian's real open modules, in an archive of their own (see above).
        o=$stage/open
        t=$o/gna/trees/open/lib/modules/$K
        mkdir -p "$t/updates/dkms" "$o/gna/open-etc/modprobe.d" "$o/lib"
        cp -al gna/kernel/. "$t/"
        cp "$open"/ko/nvidia-current-open*.ko "$t/updates/dkms/"
        depmod -b "$o/gna/trees/open" "$K"
        # As Debian's alternatives (nvidia-alternative) install nvidia-open-kernel-support's files:
        # /etc/modprobe.d/nvidia.conf is nvidia-modprobe.conf, nvidia-options.conf and
        # nvidia-blacklists-nouveau.conf keep their names; nvidia-load.conf goes to modules-load.d.
        cp "$open/root/etc/nvidia/current-open/nvidia-modprobe.conf" "$o/gna/open-etc/modprobe.d/nvidia.conf"
        for f in "$open"/root/etc/nvidia/current-open/*.conf; do
                case $(basename "$f") in
                nvidia-modprobe.conf|nvidia-load.conf) ;;
                *) cp "$f" "$o/gna/open-etc/modprobe.d/" ;;
                esac
        done
        cp -a "$open/root/lib/firmware" "$o/lib/firmware"
        [ -e gna/sys-noload ] || noload_sys "$o/gna/sys-noload"
        oko=$open/ko/nvidia-current-open.ko
        {
                echo "OPEN_VERSION='$(modinfo -F version "$oko")'"
                echo "OPEN_VERMAGIC='$(modinfo -F vermagic "$oko")'"
                echo "OPEN_FIRMWARE='$(modinfo -F firmware "$oko" | tr '\n' ' ')'"
                echo "OPEN_LICENSE='$(modinfo -F license "$oko")'"
        } >"$o/gna/open.env"
        (cd "$o" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"${out%.cpio.gz}-open.cpio.gz"
fi
rm -rf gna/kernel


# Options for the Debian file name and for the kernel name: both must reach the kernel.
# Debian's own install/remove lines (nvidia-kernel-support's nvidia.conf) are honoured as modprobe does.
cat >etc/modprobe.d/nvidia.conf <<'EOF'
# Debian's nvidia-kernel-dkms names the file nvidia-current; its options may use either name.
options nvidia-current NVreg_DeviceFileMode=432
options nvidia NVreg_RegistryDwords=RMTestKey=1
install nvidia modprobe -i nvidia-current $CMDLINE_OPTS
install nvidia-modeset modprobe nvidia ; modprobe -i nvidia-current-modeset $CMDLINE_OPTS
install nvidia-drm modprobe nvidia-modeset ; modprobe -i nvidia-current-drm $CMDLINE_OPTS
install nvidia-uvm modprobe nvidia ; modprobe -i nvidia-current-uvm $CMDLINE_OPTS
install nvidia-peermem modprobe nvidia ; modprobe -i nvidia-current-peermem $CMDLINE_OPTS
remove nvidia modprobe -r -i nvidia-drm nvidia-modeset nvidia-peermem nvidia-uvm nvidia
remove nvidia-modeset modprobe -r -i nvidia-drm nvidia-modeset
EOF

cat >gna/expect.env <<EOF
K='$K'
DRIVER_VERSION='$ver'
SIGNER='$(modinfo -F signer "$mods/std/nvidia-current.ko")'
SIG_KEY='$(modinfo -F sig_key "$mods/std/nvidia-current.ko")'
OTHER_RELEASE='$(modinfo -F vermagic "$mods/release/nvidia-current.ko" | cut -d' ' -f1)'
EOF

find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1 >"$out"
