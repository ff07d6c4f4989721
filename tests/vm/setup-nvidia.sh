#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Owns the one-time, cached part of the real-NVIDIA-module test: Debian's own nvidia-kernel-dkms
# (non-free) source, nvidia-kernel-support's modprobe.d files and firmware-nvidia-gsp's firmware,
# fetched with `apt-get download` through a private apt configuration, and the modules built by the
# real dkms for kernel K on this host (a few minutes; cached).
#
#   setup-nvidia.sh CACHE_DIR K     prints "NV=<dir>" on success
#
# Exit 77 (skip) with the reason on stderr when the archive cannot be reached and nothing is cached.
# The private apt configuration (sources list with non-free, lists, cache, empty dpkg status) lives
# under CACHE_DIR/apt: the host's /etc/apt is only read for the mirror's URI, never written, and
# nothing is installed. DKMS runs with private --dkmstree/--sourcetree/--installtree (only its MOK
# key in /var/lib/dkms is shared, as in setup.sh). Result, CACHE_DIR/nvidia-<K>/:
#   root/            the unpacked packages (usr/src/nvidia-current-<ver>, etc/modprobe.d, lib/firmware …)
#   ko/*.ko          nvidia-current*.ko as dkms installs them for K
#   version          the driver version
set -euo pipefail

cache=${1:?usage: setup-nvidia.sh CACHE_DIR K}
K=${2:?usage: setup-nvidia.sh CACHE_DIR K}
export PATH=/usr/sbin:/sbin:$PATH
log() { echo "vm-setup-nvidia: $*" >&2; }
skip() { echo "SKIP: $*" >&2; exit 77; }

dir=$cache/nvidia-$K
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
dir=$cache/nvidia-$K
exec 8>"$cache/.nvidia-lock"
flock 8
if [ -e "$dir/.done" ]; then
        echo "NV=$dir"
        exit 0
fi

command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null && command -v dkms >/dev/null ||
        skip "apt-get, dpkg-deb and dkms are needed to fetch and build Debian's nvidia-kernel-dkms"
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
[ -n "$codename" ] || skip "not Debian (no VERSION_CODENAME): there is no nvidia-kernel-dkms to fetch"
mirror=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v -- '-security' | head -n1 || :)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1 || :)
[ -n "$mirror" ] || skip "no Debian mirror in this host's apt sources"

apt_dir=$cache/apt-nvidia
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/parts" "$apt_dir/prefs" "$apt_dir/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $codename non-free non-free-firmware" >"$apt_dir/sources.list"
: >"$apt_dir/status"
private_apt() {
        apt-get -q -o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts="$apt_dir/parts" \
                -o Dir::Etc::Preferences="$apt_dir/prefs/none" -o Dir::Etc::PreferencesParts="$apt_dir/prefs" \
                -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir" -o Dir::Cache::Archives="$apt_dir/archives" \
                -o Dir::State::Status="$apt_dir/status" -o APT::Sandbox::User="$(id -un)" \
                -o Debug::NoLocking=true "$@"
}
pkgs=(nvidia-kernel-dkms nvidia-kernel-support firmware-nvidia-gsp)
if ! ls "$apt_dir/debs"/nvidia-kernel-dkms_*.deb >/dev/null 2>&1; then
        private_apt update >"$apt_dir/update.log" 2>&1 ||
                skip "apt-get update of the private non-free list failed (no network to $mirror?); see $apt_dir/update.log"
        (cd "$apt_dir/debs" && private_apt download "${pkgs[@]}") >"$apt_dir/download.log" 2>&1 ||
                skip "apt-get download ${pkgs[*]} failed; see $apt_dir/download.log"
fi

tmp=$(mktemp -d "$cache/.nvidia-tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for p in "${pkgs[@]}"; do
        dpkg-deb -x "$apt_dir/debs/${p}"_*.deb "$tmp/root"
done
src=$(ls -d "$tmp/root/usr/src"/nvidia-current-* | head -n1)
[ -f "$src/dkms.conf" ] || { echo "vm-setup-nvidia: no dkms.conf in nvidia-kernel-dkms" >&2; exit 1; }
name=$(basename "$src")
ver=${name#nvidia-current-}
start=$SECONDS
log "dkms build nvidia-current/$ver -k $K (several minutes on a loaded machine)"
d=(--dkmstree "$tmp/dkms" --sourcetree "$tmp/root/usr/src" --installtree "$tmp/install")
mkdir -p "$tmp/dkms" "$tmp/install/$K"
if ! { dkms add "${d[@]}" "nvidia-current/$ver" &&
       dkms build "${d[@]}" "nvidia-current/$ver" -k "$K" &&
       dkms install "${d[@]}" --no-depmod "nvidia-current/$ver" -k "$K"; } >"$tmp/dkms.log" 2>&1; then
        cat "$tmp/dkms.log" >&2
        find "$tmp/dkms" -name make.log -exec tail -n 40 {} + >&2 2>/dev/null || true
        echo "vm-setup-nvidia: dkms failed to build nvidia-current/$ver for $K" >&2
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
log "nvidia-current/$ver built for $K by dkms in $((SECONDS - start)) s"
echo "NV=$dir"
