#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Owns the cached kernels of the systemd boots (run-vm-systemd-test.sh): for the release K (the
# installed linux-headers-amd64's) and a second installed release K2 (the newest other ABI of the
# same flavour the archive still carries, as after an upgrade), the stock kernel image and the few
# modules the guest needs (9p, virtio, overlay to mount the host's /usr; the ipmi stack the driver
# stage loads), and K2's headers (linux-headers-K2 + its -common tree), unpacked, never installed.
#
#   setup-systemd.sh CACHE_DIR K    prints K2=, KDIR=, K2DIR= (K2 empty: no second ABI available)
#
# Layout: CACHE_DIR/sd-<release>/{vmlinuz, boot-modules/*.ko + order, usr/lib/modules/<release>/…,
# usr/src/linux-headers-… (K2 only)}. Downloads use `apt-get download` with the host's lists (read
# only, like setup.sh). Exit 77 with the reason when K's kernel cannot be had.
set -euo pipefail

cache=${1:?usage: setup-systemd.sh CACHE_DIR K}
K=${2:?usage: setup-systemd.sh CACHE_DIR K}
export PATH=/usr/sbin:/sbin:$PATH
log() { echo "vm-setup-systemd: $*" >&2; }
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
exec 7>"$cache/.systemd-lock"
flock 7

# fetch RELEASE WITH_HEADERS: the kernel image and module subset (and headers) of one release.
fetch() {
        local rel=$1 headers=$2 d=$cache/sd-$1 tmp
        [ -e "$d/.done-2" ] && return 0
        tmp=$(mktemp -d "$cache/.sd-tmp.XXXXXX")
        local pkgs=("linux-image-$rel")
        if [ "$headers" = 1 ]; then
                local common
                common=$(apt-cache depends "linux-headers-$rel" 2>/dev/null | awk '/Depends: linux-headers-.*-common/ { print $2; exit }')
                pkgs+=("linux-headers-$rel" "$common")
        fi
        log "downloading ${pkgs[*]}"
        if ! (cd "$tmp" && apt-get download "${pkgs[@]}" >&2); then
                rm -rf "$tmp"
                return 1
        fi
        for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
        rm -f "$tmp"/*.deb
        depmod -b "$tmp/root" "$rel"
        local out=$tmp/out m=$tmp/root/lib/modules/$rel
        mkdir -p "$out/boot-modules" "$out/usr/lib/modules/$rel"
        cp "$tmp/root/boot/vmlinuz-$rel" "$out/vmlinuz"
        # What /init loads to reach the host's /usr, in dependency order.
        for mod in 9p 9pnet_virtio virtio_pci overlay; do
                modprobe -d "$tmp/root" -S "$rel" --show-depends "$mod" | awk '$1 == "insmod" { print $2 }'
        done | awk '!seen[$0]++' | while read -r ko; do
                cp "$ko" "$out/boot-modules/"
                basename "$ko" >>"$out/boot-modules/order"
        done
        # The guest's own module tree: those, the ipmi stack, what the real NVIDIA modules depend on
        # (drm, drm_kms_helper, video), the kernel's module lists.
        cp "$m"/modules.builtin* "$m/modules.order" "$out/usr/lib/modules/$rel/"
        for mod in 9p 9pnet_virtio virtio_pci overlay ipmi_devintf drm drm_kms_helper video; do
                modprobe -d "$tmp/root" -S "$rel" --show-depends "$mod" | awk '$1 == "insmod" { print $2 }'
        done | sort -u | while read -r ko; do
                local rel_path=${ko#"$tmp/root/lib/"}
                mkdir -p "$out/usr/lib/$(dirname "$rel_path")"
                cp "$ko" "$out/usr/lib/$rel_path"
        done
        if [ "$headers" = 1 ]; then
                mkdir -p "$out/usr/src"
                cp -a "$tmp/root/usr/src/." "$out/usr/src/"
                ln -s "/usr/src/linux-headers-$rel" "$out/usr/lib/modules/$rel/build"
        fi
        depmod -b "$out/usr" "$rel"
        rm -rf "$d"
        mv "$out" "$d"
        rm -rf "$tmp"
        touch "$d/.done-2"
        log "kernel $rel cached in $d"
}

fetch "$K" 0 || { echo "SKIP: apt-get download linux-image-$K failed (the archive may no longer carry this ABI)" >&2; exit 77; }

# The second release: the newest other ABI of K's flavour with headers in the archive.
flavour=${K#*-*-}
abi=$(echo "$K" | cut -d- -f2)
K2=${GNA_VM_KERNEL2:-}
if [ -z "$K2" ]; then
        K2=$(ls -d "$cache"/sd-*/.k2 2>/dev/null | head -n1 | sed 's|.*/sd-\(.*\)/.k2|\1|' || :)
fi
if [ -z "$K2" ]; then
        K2=$(apt-cache search --names-only "^linux-headers-[0-9.]+-[0-9]+-$flavour\$" 2>/dev/null |
                awk '{ print $1 }' | sed 's/^linux-headers-//' |
                awk -F- -v abi="$abi" '$2 != abi { print $2, $0 }' | sort -n | tail -n1 | cut -d' ' -f2 || :)
fi
if [ -n "$K2" ] && fetch "$K2" 1; then
        touch "$cache/sd-$K2/.k2"
else
        log "no second kernel release with headers could be fetched: the --prepare-kernel boot cannot run"
        K2=
fi
echo "K2=$K2"
echo "KDIR=$cache/sd-$K"
echo "K2DIR=${K2:+$cache/sd-$K2}"
