#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Owns the one-time, cached part of the real-kernel suite: checking the host tools (QEMU, static
# busybox, cpio, dkms, linux-headers; scripts/deps.sh installs them), the stock kernel the installed
# headers are for (downloaded and unpacked, never installed), and the stand-in NVIDIA modules built
# for it by the real dkms.
#
#   setup.sh CACHE_DIR      prints "K=<release>" and "DIR=<CACHE_DIR>/<release>" on success
#
# Exit status 77 (skip) only when a host tool or the headers are missing, with the reason on stderr.
# Everything lands in CACHE_DIR/<release>/ (about 10 MB), keyed by the kernel release because old
# ABIs leave the Debian archive at point releases:
#   kernel/vmlinuz
#   kernel/lib/modules/<K>/   ib_core and ipmi closures, modules.builtin*, modules.order (depmod'd)
#   dkms-<hash>/{std,enoexec,release}/*.ko   <hash> covers dkms-src/ and this script
# DKMS runs with private --dkmstree/--sourcetree/--installtree and --no-depmod, so the host's DKMS
# state and /lib/modules are never touched; only DKMS's MOK key (/var/lib/dkms/mok.{key,pub}) is
# shared, created by dkms itself on first use exactly as on a real host. Runs hold a lock on
# CACHE_DIR, so parallel runs wait instead of racing.
set -euo pipefail

cache=${1:?usage: setup.sh CACHE_DIR}
src=$(cd "$(dirname "$0")" && pwd)
export PATH=/usr/sbin:/sbin:$PATH

log() { echo "vm-setup: $*" >&2; }
skip() { echo "SKIP: $*" >&2; exit 77; }

# --- tools ------------------------------------------------------------------------------------------
# Installed by scripts/deps.sh (./scripts/test); this script never installs anything itself.
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
[ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' || need_pkgs+=(busybox-static file)
command -v cpio >/dev/null || need_pkgs+=(cpio)
command -v dkms >/dev/null || need_pkgs+=(dkms)
dpkg-query -W -f '${Status}' linux-headers-amd64 2>/dev/null | grep -q 'ok installed' || need_pkgs+=(linux-headers-amd64)
[ ${#need_pkgs[@]} -eq 0 ] ||
        skip "missing ${need_pkgs[*]}: ./scripts/test installs them (scripts/deps.sh), or apt-get install --no-install-recommends ${need_pkgs[*]}"
for t in cpio dkms depmod modprobe dpkg-deb apt-get; do
        command -v $t >/dev/null || { echo "vm-setup: $t is missing." >&2; exit 1; }
done

# --- the kernel release: the one linux-headers-amd64 points at -----------------------------------------
K=${GNA_VM_KERNEL:-}
if [ -z "$K" ]; then
        K=$(dpkg-query -W -f '${Depends}' linux-headers-amd64 2>/dev/null |
                grep -o 'linux-headers-[^ ,]*-amd64' | head -n1 | sed 's/^linux-headers-//')
fi
[ -n "$K" ] && [ -d "/lib/modules/$K/build" ] ||
        skip "no kernel headers found (linux-headers-amd64 is not installed or points at no linux-headers-<release>)"

dir=$cache/$K
mkdir -p "$dir"
exec 9>"$cache/.lock"
flock 9

tmp=$(mktemp -d "$dir/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# --- the stock kernel, unpacked --------------------------------------------------------------------
if [ ! -e "$dir/kernel/.done" ]; then
        start=$SECONDS
        rm -rf "$dir/kernel"
        log "downloading linux-image-$K"
        (cd "$tmp" && apt-get download "linux-image-$K" >&2) ||
                { echo "vm-setup: apt-get download linux-image-$K failed: the archive may no longer carry this ABI; upgrade linux-headers-amd64." >&2; exit 1; }
        dpkg-deb -x "$tmp"/linux-image-"$K"_*.deb "$tmp/root"
        rm -f "$tmp"/linux-image-"$K"_*.deb
        depmod -b "$tmp/root" "$K"
        mkdir -p "$dir/.kernel.new/lib/modules/$K"
        cp "$tmp/root/boot/vmlinuz-$K" "$dir/.kernel.new/vmlinuz"
        cp "$tmp/root/lib/modules/$K"/modules.builtin* "$tmp/root/lib/modules/$K/modules.order" \
                "$dir/.kernel.new/lib/modules/$K/"
        # The in-tree modules the tests load: ib_core (nvidia-peermem's dependency) and the ipmi stack
        # the driver stage loads best effort, each with its dependency closure.
        for m in ib_core ipmi_devintf; do
                modprobe -d "$tmp/root" -S "$K" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
        done | sort -u | while read -r ko; do
                rel=${ko#"$tmp/root/"}
                mkdir -p "$dir/.kernel.new/$(dirname "$rel")"
                cp "$ko" "$dir/.kernel.new/$rel"
        done
        depmod -b "$dir/.kernel.new" "$K"
        rm -rf "$tmp/root"
        mv "$dir/.kernel.new" "$dir/kernel"
        touch "$dir/kernel/.done"
        log "kernel $K unpacked in $((SECONDS - start)) s"
fi

# --- stand-in modules, built by the real dkms ----------------------------------------------------------
hash=$( (cd "$src" && find dkms-src -type f | LC_ALL=C sort | xargs sha256sum; sha256sum setup.sh) | sha256sum | cut -c1-12)
mods=$dir/dkms-$hash
if [ ! -e "$mods/.done" ]; then
        start=$SECONDS
        rm -rf "$dir"/dkms-*
        pkg=nvidia-current ver=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' "$src/dkms-src/dkms.conf")
        mkdir -p "$tmp/src"
        cp -r "$src/dkms-src" "$tmp/src/$pkg-$ver"

        # Other headers for the same kernel: copies of the headers tree (the per-flavour part, 3 MB;
        # it includes the shared -common tree by absolute path) with one thing changed.
        #  enoexec: a kernel configured without PREEMPT_BUILD: vermagic lacks "preempt", the kernel
        #           refuses the module with ENOEXEC like one built against another kernel's headers.
        #  release: the same ABI under another release name (like the previous ABI's headers):
        #           with MODVERSIONS the kernel accepts it; only a vermagic check notices.
        other_release=$(echo "$K" | awk -F- '{ OFS = "-"; $2 = $2 + 1000; print }')
        hdr=$(readlink -f "/lib/modules/$K/build")
        for v in enoexec release; do
                cp -a "$hdr" "$tmp/headers-$v"
                # Debian's scripts/ and tools/ links are relative to /usr/src: make them absolute.
                for l in "$hdr"/*; do
                        [ -L "$l" ] && ln -sfn "$(readlink -f "$l")" "$tmp/headers-$v/$(basename "$l")"
                done
        done
        sed -i '/^#define CONFIG_PREEMPT_BUILD 1$/d' "$tmp/headers-enoexec/include/generated/autoconf.h"
        sed -i 's/^CONFIG_PREEMPT_BUILD=y$/# CONFIG_PREEMPT_BUILD is not set/' \
                "$tmp/headers-enoexec/.config" "$tmp/headers-enoexec/include/config/auto.conf"
        echo "#define UTS_RELEASE \"$other_release\"" >"$tmp/headers-release/include/generated/utsrelease.h"

        for v in std enoexec release; do
                d=(--dkmstree "$tmp/dkms-$v" --sourcetree "$tmp/src" --installtree "$tmp/install-$v")
                ksrc=()
                [ "$v" = std ] || ksrc=(--kernelsourcedir "$tmp/headers-$v")
                mkdir -p "$tmp/dkms-$v" "$tmp/install-$v/$K"
                log "dkms build $pkg/$ver -k $K ($v)"
                if ! { dkms add "${d[@]}" "$pkg/$ver" &&
                       dkms build "${d[@]}" "${ksrc[@]}" "$pkg/$ver" -k "$K" &&
                       dkms install "${d[@]}" "${ksrc[@]}" --no-depmod "$pkg/$ver" -k "$K"; } >"$tmp/dkms-$v.log" 2>&1; then
                        cat "$tmp/dkms-$v.log" >&2
                        find "$tmp/dkms-$v" -name make.log -exec cat {} + >&2 2>/dev/null || true
                        echo "vm-setup: dkms failed to build the stand-in modules ($v); log above." >&2
                        exit 1
                fi
                mkdir -p "$tmp/out/$v"
                cp "$tmp/install-$v/$K"/updates/dkms/*.ko "$tmp/out/$v/"
        done
        ! modinfo -F vermagic "$tmp/out/enoexec/nvidia-current.ko" | grep -qw preempt ||
                { echo "vm-setup: the enoexec build did not change the vermagic flags." >&2; exit 1; }
        [ "$(modinfo -F vermagic "$tmp/out/release/nvidia-current.ko" | cut -d' ' -f1)" = "$other_release" ] ||
                { echo "vm-setup: the release build did not change the vermagic release." >&2; exit 1; }
        mv "$tmp/out" "$mods"
        touch "$mods/.done"
        log "stand-in modules built by dkms in $((SECONDS - start)) s"
fi

echo "K=$K"
echo "DIR=$dir"
echo "MODS=$mods"
