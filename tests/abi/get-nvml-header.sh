#!/bin/sh
# SPDX-License-Identifier: MIT
# Owns fetching NVIDIA's real nvml.h for the ABI conformance test, without installing anything:
# Debian's libnvidia-ml-dev (non-free) is downloaded with `apt-get download` into a cache directory and
# unpacked there with dpkg-deb -x. Installing the package would pull in the driver's libnvidia-ml1 and
# make the machine a "has NVML" machine, which the no-NVML tests must not see.
#
# Usage: get-nvml-header.sh CACHE_DIR
# Prints the include directory that holds nvml.h. Exit 77 (meson's "skip") with the reason on stderr
# when the header cannot be had: not Debian and nothing cached, or the archive unreachable. The
# download goes through a private apt configuration under CACHE_DIR: no root needed, and the host's
# apt sources, lists and package state are left exactly as they were.
set -eu

cache=${1:?usage: get-nvml-header.sh CACHE_DIR}
inc="$cache/root/usr/include"

skip() {
        echo "nvml-abi: skipped: $*" >&2
        exit 77
}

if [ -f "$inc/nvml.h" ]; then
        echo "$inc"
        exit 0
fi
mkdir -p "$cache"

unpack() {
        rm -rf "$cache/root.tmp"
        dpkg-deb -x "$1" "$cache/root.tmp"
        [ -f "$cache/root.tmp/usr/include/nvml.h" ] || { echo "nvml-abi: $1 has no usr/include/nvml.h" >&2; exit 1; }
        rm -rf "$cache/root"
        mv "$cache/root.tmp" "$cache/root"
        echo "$inc"
        exit 0
}

# A package downloaded earlier (or put there by hand, e.g. on a machine without network).
for deb in "$cache"/libnvidia-ml-dev_*.deb; do
        [ -f "$deb" ] && unpack "$deb"
done

command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 ||
        skip "apt-get and dpkg-deb are needed to fetch libnvidia-ml-dev (Debian), and $cache holds no copy."
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
[ -n "$codename" ] && [ -f /etc/debian_version ] ||
        skip "this is not Debian (no VERSION_CODENAME in /etc/os-release), so there is no libnvidia-ml-dev to fetch."

# A private apt configuration: its own sources list (the host's Debian mirror, component non-free),
# lists and cache under $cache. The host's /etc/apt is only read (for the mirror's URI), never
# written; its lists and package state are not used; nothing is installed.
mirror=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v -- '-security' | head -n1 || :)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1 || :)
[ -n "$mirror" ] || skip "no Debian mirror found in this host's apt sources, so libnvidia-ml-dev cannot be fetched; put libnvidia-ml-dev_*.deb in $cache."
apt_dir="$cache/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/parts" "$apt_dir/prefs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $codename non-free" >"$apt_dir/sources.list"
: >"$apt_dir/status"
private_apt() {
        apt-get -q -o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts="$apt_dir/parts" \
                -o Dir::Etc::Preferences="$apt_dir/prefs/none" -o Dir::Etc::PreferencesParts="$apt_dir/prefs" \
                -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir" -o Dir::Cache::Archives="$apt_dir/archives" \
                -o Dir::State::Status="$apt_dir/status" -o APT::Sandbox::User="$(id -un)" \
                -o Debug::NoLocking=true "$@"
}
private_apt update >"$cache/apt-update.log" 2>&1 ||
        skip "apt-get update of the private non-free list failed (no network to $mirror?); see $cache/apt-update.log."
(cd "$cache" && private_apt download libnvidia-ml-dev) >"$cache/apt-download.log" 2>&1 ||
        skip "apt-get download libnvidia-ml-dev failed (no network to the Debian archive?); see $cache/apt-download.log."

for deb in "$cache"/libnvidia-ml-dev_*.deb; do
        [ -f "$deb" ] && unpack "$deb"
done
echo "nvml-abi: apt-get download libnvidia-ml-dev left no .deb in $cache" >&2
exit 1
