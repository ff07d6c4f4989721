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
#   kernel/lib/modules/<K>/   ib_core, ipmi and drm closures, modules.builtin*, modules.order (depmod'd)
#   dkms-<hash>/{std,enoexec,release}/*.ko   <hash> covers dkms-src/ and this script
#   nvidia-real-<version>/    Debian's real nvidia-current modules and modprobe.d files (see below)
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
# The in-tree modules the tests load, each with its dependency closure: ib_core (nvidia-peermem's
# dependency), the ipmi stack the driver stage loads best effort, drm (the real nvidia's dependency).
# .done holds this list: a cache made for another list is made again.
intree="ib_core ipmi_devintf drm"
if [ "$(cat "$dir/kernel/.done" 2>/dev/null)" != "$intree" ]; then
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
        for m in $intree; do
                modprobe -d "$tmp/root" -S "$K" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
        done | sort -u | while read -r ko; do
                rel=${ko#"$tmp/root/"}
                mkdir -p "$dir/.kernel.new/$(dirname "$rel")"
                cp "$ko" "$dir/.kernel.new/$rel"
        done
        depmod -b "$dir/.kernel.new" "$K"
        rm -rf "$tmp/root"
        rm -rf "$dir/kernel"
        mv "$dir/.kernel.new" "$dir/kernel"
        echo "$intree" >"$dir/kernel/.done"
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

# --- Debian's real NVIDIA driver, built by the real dkms (item 6 of issue 16) ------------------------
# nvidia-kernel-dkms (the proprietary modules' source) and nvidia-kernel-support (modprobe.d files)
# fetched with `apt-get download` through a private apt configuration (bookworm with contrib and
# non-free; the host's sources are never used or changed), built once for $K with private DKMS trees
# (minutes), cached by driver version under $dir/nvidia-real-<version>/:
#   *.ko        nvidia-current*.ko as dkms installs them
#   modprobe/   Debian's /etc/nvidia/current/*.conf (installed as /etc/modprobe.d/nvidia*.conf)
# GNA_VM_REAL_NVIDIA=0 leaves it out (the "real" boot is then not run, and the run says so).
real=
if [ "${GNA_VM_REAL_NVIDIA:-1}" != 0 ]; then
        for d in "$dir"/nvidia-real-*/; do
                [ -e "$d.done" ] && real=${d%/}
        done
        if [ -z "$real" ]; then
                start=$SECONDS
                apt_dir=$cache/apt
                mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
                for suite in bookworm bookworm-updates; do
                        echo "deb http://deb.debian.org/debian $suite main contrib non-free non-free-firmware"
                done >"$apt_dir/sources.list"
                echo "deb http://deb.debian.org/debian-security bookworm-security main contrib non-free non-free-firmware" \
                        >>"$apt_dir/sources.list"
                apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
                          -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o Debug::NoLocking=1
                          -o APT::Sandbox::User=root)
                log "fetching nvidia-kernel-dkms and nvidia-kernel-support (private apt configuration)"
                apt-get -q "${apt_opts[@]}" update >&2
                rm -f "$apt_dir/debs"/*.deb
                (cd "$apt_dir/debs" && apt-get -q "${apt_opts[@]}" download nvidia-kernel-dkms nvidia-kernel-support >&2)
                rm -rf "$tmp/real" && mkdir -p "$tmp/real/x" "$tmp/real/dkms" "$tmp/real/install/$K"
                for deb in "$apt_dir/debs"/*.deb; do dpkg-deb -x "$deb" "$tmp/real/x"; done
                rver=$(ls "$tmp/real/x/usr/src" | sed -n 's/^nvidia-current-//p' | head -n1)
                [ -n "$rver" ] || { echo "vm-setup: nvidia-kernel-dkms has no /usr/src/nvidia-current-*." >&2; exit 1; }
                d=(--dkmstree "$tmp/real/dkms" --sourcetree "$tmp/real/x/usr/src" --installtree "$tmp/real/install")
                log "dkms build nvidia-current/$rver -k $K (Debian's real driver; minutes)"
                if ! { dkms add "${d[@]}" "nvidia-current/$rver" &&
                       dkms build "${d[@]}" "nvidia-current/$rver" -k "$K" &&
                       dkms install "${d[@]}" --no-depmod "nvidia-current/$rver" -k "$K"; } >"$tmp/real.log" 2>&1; then
                        tail -n 50 "$tmp/real.log" >&2
                        find "$tmp/real/dkms" -name make.log -exec tail -n 50 {} + >&2 2>/dev/null || true
                        echo "vm-setup: dkms failed to build Debian's nvidia-current $rver; log above." >&2
                        exit 1
                fi
                real=$dir/nvidia-real-$rver
                rm -rf "$dir"/nvidia-real-*
                mkdir -p "$real/modprobe"
                cp "$tmp/real/install/$K"/updates/dkms/nvidia-current*.ko "$real/"
                cp "$tmp/real/x/etc/nvidia/current"/*.conf "$real/modprobe/"
                touch "$real/.done"
                log "Debian's nvidia-current $rver built by dkms in $((SECONDS - start)) s"
        fi
fi

echo "K=$K"
echo "DIR=$dir"
echo "MODS=$mods"
echo "REAL=$real"
