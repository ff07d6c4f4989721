#!/bin/sh
# SPDX-License-Identifier: MIT
# Owns fetching NVIDIA's real nvml.h for the ABI conformance test, without installing anything:
# Debian's libnvidia-ml-dev (non-free) is downloaded with `apt-get download` into a cache directory and
# unpacked there with dpkg-deb -x. Installing the package would pull in the driver's libnvidia-ml1 and
# make the machine a "has NVML" machine, which the no-NVML tests must not see.
#
# Usage: get-nvml-header.sh CACHE_DIR
# Prints the include directory that holds nvml.h. Exit 77 (meson's "skip") with the reason on stderr
# when the header cannot be had: not Debian, not root and nothing cached, or the archive unreachable.
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
[ "$(id -u)" = 0 ] ||
        skip "fetching libnvidia-ml-dev needs root (apt sources, apt-get update) and $cache holds no copy; run the test once as root or put libnvidia-ml-dev_*.deb there."

# Make sure some apt source offers the non-free component (deb822 "Components:" or one-line "deb" form).
has_non_free() {
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
                [ -f "$f" ] || continue
                grep -Eq '^[[:space:]]*Components:.*[[:space:]]non-free([[:space:]]|$)' "$f" && return 0
                grep -Eq '^[[:space:]]*deb[[:space:]].*[[:space:]]non-free([[:space:]]|$)' "$f" && return 0
        done
        return 1
}

if ! has_non_free; then
        codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
        [ -n "$codename" ] && [ -f /etc/debian_version ] ||
                skip "this is not Debian (no VERSION_CODENAME in /etc/os-release), so there is no libnvidia-ml-dev to fetch."
        cat > /etc/apt/sources.list.d/gna-non-free.sources <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: $codename
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        echo "nvml-abi: added /etc/apt/sources.list.d/gna-non-free.sources (Debian non-free, for libnvidia-ml-dev)" >&2
fi

# Refresh the lists only when apt does not know the package yet: apt-get update is the slow part.
candidate=$(apt-cache policy libnvidia-ml-dev 2>/dev/null | sed -n 's/^[[:space:]]*Candidate:[[:space:]]*//p')
if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
        apt-get -o DPkg::Lock::Timeout=600 -qq update >"$cache/apt-update.log" 2>&1 ||
                skip "apt-get update failed (no network to the Debian archive?); see $cache/apt-update.log."
fi

# apt-get download drops to the _apt user: let it write the cache directory.
chmod 0777 "$cache" 2>/dev/null || :
(cd "$cache" && apt-get -o DPkg::Lock::Timeout=600 -qq download libnvidia-ml-dev) >"$cache/apt-download.log" 2>&1 ||
        skip "apt-get download libnvidia-ml-dev failed (no network to the Debian archive?); see $cache/apt-download.log."

for deb in "$cache"/libnvidia-ml-dev_*.deb; do
        [ -f "$deb" ] && unpack "$deb"
done
echo "nvml-abi: apt-get download libnvidia-ml-dev left no .deb in $cache" >&2
exit 1
