#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Owns the one-time, cached part of the real-NVIDIA-module tests: Debian's own nvidia-kernel-dkms
# (non-free; the proprietary modules) or nvidia-open-kernel-dkms (contrib; NVIDIA's open kernel
# modules) source, the matching nvidia-kernel-support / nvidia-open-kernel-support modprobe.d files
# and firmware-nvidia-gsp's firmware, fetched with `apt-get download` through a private apt
# configuration, and the modules built by the real dkms for kernel K on this host (a few minutes;
# cached).
#
#   setup-nvidia.sh CACHE_DIR K [proprietary|open]     prints "NV=<dir>" on success
#
# Exit 77 (skip) with the reason on stderr when the archive cannot be reached and nothing is cached.
# The private apt configuration (sources list with contrib, non-free and non-free-firmware, lists,
# cache, empty dpkg status) lives under CACHE_DIR/apt-nvidia (open: CACHE_DIR/apt-nvidia-open): the
# host's /etc/apt is only read for the mirror's URI, never written, and nothing is installed. DKMS
# runs with private --dkmstree/--sourcetree/--installtree (only its MOK key in /var/lib/dkms is
# shared, as in setup.sh). Each flavour has its own result directory and lock, so the two can be
# prepared in parallel. Result, CACHE_DIR/nvidia-<K>/ (open: CACHE_DIR/nvidia-open-<K>/):
#   root/            the unpacked packages (etc/nvidia/current[-open]/*.conf, lib/firmware …)
#   ko/*.ko          nvidia-current*.ko (open: nvidia-current-open*.ko) as dkms installs them for K
#   version          the driver version
set -euo pipefail

cache=${1:?usage: setup-nvidia.sh CACHE_DIR K [proprietary|open]}
K=${2:?usage: setup-nvidia.sh CACHE_DIR K [proprietary|open]}
flavour=${3:-proprietary}
case $flavour in
proprietary) sfx='' pkgs=(nvidia-kernel-dkms nvidia-kernel-support firmware-nvidia-gsp) ;;
open) sfx=-open pkgs=(nvidia-open-kernel-dkms nvidia-open-kernel-support firmware-nvidia-gsp) ;;
*) echo "setup-nvidia.sh: unknown flavour '$flavour': proprietary or open" >&2; exit 2 ;;
esac
export PATH=/usr/sbin:/sbin:$PATH
log() { echo "vm-setup-nvidia: $*" >&2; }
skip() { echo "SKIP: $*" >&2; exit 77; }

mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
dir=$cache/nvidia$sfx-$K
exec 8>"$cache/.nvidia$sfx-lock"
flock 8
if [ -e "$dir/.done" ]; then
        echo "NV=$dir"
        exit 0
fi

command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null && command -v dkms >/dev/null ||
        skip "apt-get, dpkg-deb and dkms are needed to fetch and build Debian's ${pkgs[0]}"
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
[ -n "$codename" ] || skip "not Debian (no VERSION_CODENAME): there is no ${pkgs[0]} to fetch"
mirror=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v -- '-security' | head -n1 || :)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1 || :)
[ -n "$mirror" ] || skip "no Debian mirror in this host's apt sources"

apt_dir=$cache/apt-nvidia$sfx
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/parts" "$apt_dir/prefs" "$apt_dir/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $codename contrib non-free non-free-firmware" >"$apt_dir/sources.list"
: >"$apt_dir/status"
private_apt() {
        apt-get -q -o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts="$apt_dir/parts" \
                -o Dir::Etc::Preferences="$apt_dir/prefs/none" -o Dir::Etc::PreferencesParts="$apt_dir/prefs" \
                -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir" -o Dir::Cache::Archives="$apt_dir/archives" \
                -o Dir::State::Status="$apt_dir/status" -o APT::Sandbox::User="$(id -un)" \
                -o Debug::NoLocking=true "$@"
}
if ! ls "$apt_dir/debs/${pkgs[0]}"_*.deb >/dev/null 2>&1; then
        private_apt update >"$apt_dir/update.log" 2>&1 ||
                skip "apt-get update of the private contrib/non-free list failed (no network to $mirror?); see $apt_dir/update.log"
        (cd "$apt_dir/debs" && private_apt download "${pkgs[@]}") >"$apt_dir/download.log" 2>&1 ||
                skip "apt-get download ${pkgs[*]} failed; see $apt_dir/download.log"
fi

tmp=$(mktemp -d "$cache/.nvidia-tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for p in "${pkgs[@]}"; do
        dpkg-deb -x "$apt_dir/debs/${p}"_*.deb "$tmp/root"
done
src=$(ls -d "$tmp/root/usr/src"/nvidia-current$sfx-[0-9]* | head -n1)
[ -f "$src/dkms.conf" ] || { echo "vm-setup-nvidia: no dkms.conf in ${pkgs[0]}" >&2; exit 1; }
# dkms.conf names the package (nvidia-current, nvidia-current-open) and its version.
pkg=$(sed -n 's/^PACKAGE_NAME="\(.*\)"/\1/p' "$src/dkms.conf")
ver=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' "$src/dkms.conf")
[ "$(basename "$src")" = "$pkg-$ver" ] ||
        { echo "vm-setup-nvidia: ${pkgs[0]}'s dkms.conf names $pkg-$ver, not $(basename "$src")" >&2; exit 1; }
# The open modules' source calls the kernel's PCI API directly (the proprietary package's does not). Linux
# 6.1.x stable updates gave pci_resize_resource() a fourth argument, exclude_bars ("PCI: Fix BAR resize
# for devices on a root bus"), after Debian's 535.261.03-1 was built: as shipped it fails to compile
# against such headers ("too few arguments to function 'pci_resize_resource'", nvidia/nv-pci.c), as it
# would on a real host. Pass 0 (no BAR kept out of the resize, the old behaviour) when the headers
# declare the argument and the source does not yet pass it, as an upstream fix does; said in the log.
if [ "$flavour" = open ]; then
        hdr=$(readlink -f "/lib/modules/$K/build")
        common=$(sed -n 's|^include \(/.*\)/Makefile$|\1|p' "$hdr/Makefile" 2>/dev/null | head -n1)
        pci_h=
        for f in "$hdr/include/linux/pci.h" "${common:-/nonexistent}/include/linux/pci.h"; do
                [ -f "$f" ] && pci_h=$f
        done
        if [ -n "$pci_h" ] && grep -A1 'pci_resize_resource(struct pci_dev' "$pci_h" | grep -q exclude_bars &&
           grep -q 'pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size);' "$src/nvidia/nv-pci.c"; then
                sed -i 's/pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size);/pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size, 0);/' \
                        "$src/nvidia/nv-pci.c"
                log "patched $pkg-$ver's nvidia/nv-pci.c for $K's pci_resize_resource(…, exclude_bars) ($pci_h)"
        fi
fi
start=$SECONDS
log "dkms build $pkg/$ver -k $K (several minutes on a loaded machine)"
d=(--dkmstree "$tmp/dkms" --sourcetree "$tmp/root/usr/src" --installtree "$tmp/install")
mkdir -p "$tmp/dkms" "$tmp/install/$K"
if ! { dkms add "${d[@]}" "$pkg/$ver" &&
       dkms build "${d[@]}" "$pkg/$ver" -k "$K" &&
       dkms install "${d[@]}" --no-depmod "$pkg/$ver" -k "$K"; } >"$tmp/dkms.log" 2>&1; then
        cat "$tmp/dkms.log" >&2
        find "$tmp/dkms" -name make.log -exec tail -n 40 {} + >&2 2>/dev/null || true
        echo "vm-setup-nvidia: dkms failed to build $pkg/$ver for $K" >&2
        exit 1
fi
mkdir -p "$tmp/out/ko"
find "$tmp/install/$K" -name '*.ko' -exec cp {} "$tmp/out/ko/" \;
cp "$tmp/dkms.log" "$tmp/out/dkms.log"
# Keep the package files the guest needs (modprobe.d, firmware, the dkms source is not needed).
rm -rf "$tmp/root/usr/src" "$tmp/root/usr/share/doc"
mv "$tmp/root" "$tmp/out/root"
echo "$ver" >"$tmp/out/version"
rm -rf "$dir"
mv "$tmp/out" "$dir"
touch "$dir/.done"
log "$pkg/$ver built for $K by dkms in $((SECONDS - start)) s"
echo "NV=$dir"
