# SPDX-License-Identifier: MIT
# Sourced by scripts/demo and scripts/test: installs the Debian packages the build and the tests need,
# only those that are missing (so a prepared machine pays nothing).
GNA_PACKAGES=(
        gcc meson ninja-build pkg-config
        libsystemd-dev libkmod-dev libpci-dev libyaml-dev libcurl4-openssl-dev libcmocka-dev
        dbus python3 python3-jsonschema python3-yaml valgrind util-linux systemd systemd-container kmod pciutils
        man-db
)

gna_install_deps() {
        local missing=() p
        for p in "${GNA_PACKAGES[@]}" "$@"; do
                dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
        done
        [ ${#missing[@]} -eq 0 ] && return 0
        if [ "$(id -u)" -ne 0 ]; then
                echo "Missing Debian packages: ${missing[*]} — run this script as root, or install them." >&2
                return 1
        fi
        echo "Installing: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null || return 1
        apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" >/dev/null || return 1
}
